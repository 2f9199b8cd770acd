"""infra/ for tenants (issue 15, its Terraform half): the topic is the identity. Pub/Sub does
not tell a subscriber who published a message, so each tenant publishes on a topic of its own
whose publisher IAM admits that tenant's principals only, intake takes the tenant from the topic
a message came on, and each tenant reads its events from a subscription filtered on the
``tenant`` attribute.

The HCL is evaluated, not pattern-matched: a small evaluator over python-hcl2's parse tree
(below) computes the ``for_each`` maps, locals, module inputs and outputs of infra/ for
``terraform.tfvars.example`` the way Terraform would, leaving what only Google knows (a service
account's email, a function's service) as symbolic references. Where Terraform is installed,
``terraform console`` evaluates the same locals from the same files and must agree (it needs no
provider for locals and variables; ``terraform validate`` does, and cannot run here)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import hcl2
import pytest
from lark import Token, Tree

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MODULES = INFRA / "modules"
EXAMPLE = INFRA / "terraform.tfvars.example"

# The names the Python side uses (opendws.ports), fixed by issue 15.
ADMIN_TOPIC = "capacity-admin-requests"
SHARED_TOPIC = "capacity-requests"
EVENTS_TOPIC = "capacity-events"
MESSAGE_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"


def tenant_topic(tenant: str) -> str:
    return f"capacity-requests-{tenant}"


# A small evaluator of the HCL infra/ is written in ---------------------------------------------


class Unknown(Exception):
    """A value Terraform knows only at apply time was needed to decide something."""


@dataclass(frozen=True)
class Ref:
    """A value known only to Google or to Terraform at apply time (``module.identities.
    members.ci_hook``, ``google_cloudfunctions2_function.this.service_config[0].service``),
    kept as its reference."""

    path: str

    def attr(self, name: str) -> Ref:
        return Ref(f"{self.path}.{name}")

    def index(self, key: object) -> Ref:
        return Ref(f"{self.path}[{json.dumps(key)}]")

    def __str__(self) -> str:
        return "${" + self.path + "}"


class View:
    """Something an HCL traversal reaches into (``var``, ``local``, ``module.x``, a resource)."""

    def attr(self, name: str) -> Any:
        raise NotImplementedError

    def index(self, key: object) -> Any:
        raise Unknown(f"{self} cannot be indexed")


def trees(node: Tree[Token]) -> list[Tree[Token]]:
    return [c for c in node.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def has_token(node: Tree[Token], text: str) -> bool:
    return any(isinstance(c, Token) and str(c).strip() == text for c in node.children)


def name_of(node: Tree[Token]) -> str:
    """The text of an identifier, keyword or quoted label."""
    if node.data == "string":
        return "".join(str(part.children[0]) for part in trees(node))
    (token,) = node.children
    return str(token)


def unescape(text: str) -> str:
    """A quoted HCL string's literal part (\\" \\\\ \\n \\t, and $${ %%{ for ${ %{)."""
    text = text.replace("$${", "${").replace("%%{", "%{")
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m[1], m[1]), text)


def render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def iterate(collection: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) as an HCL ``for`` sees them: a map's in lexical key order, a list's by
    index."""
    if isinstance(collection, Ref):
        raise Unknown(f"for over {collection}")
    if isinstance(collection, dict):
        yield from ((key, collection[key]) for key in sorted(collection))
    else:
        yield from enumerate(collection)


def flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [item for element in value for item in flatten(element)]
    return [value]


def regex(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"{pattern!r} does not match {text!r}")
    return found.group(0)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "merge": lambda *maps: {k: v for m in maps for k, v in m.items()},
    "concat": lambda *lists: [x for xs in lists for x in xs],
    "distinct": lambda xs: list(dict.fromkeys(xs)),
    "flatten": flatten,
    "keys": sorted,
    "values": lambda m: [m[k] for k in sorted(m)],
    "toset": lambda xs: sorted(set(xs), key=str),  # a Ref (a member Google names) too
    "tomap": dict,
    "contains": lambda xs, x: x in xs,
    "length": len,
    "alltrue": all,
    "anytrue": any,
    "regex": regex,
    "split": lambda sep, text: text.split(sep),
    "element": lambda xs, i: xs[i % len(xs)],
    "reverse": lambda xs: list(reversed(xs)),
    "tostring": render,
    "startswith": lambda text, prefix: text.startswith(prefix),
    "compact": lambda xs: [x for x in xs if x not in ("", None)],
    "setproduct": lambda *sets: [list(p) for p in itertools.product(*sets)],
    "join": lambda sep, xs: sep.join(xs),
    "coalesce": lambda *xs: next(x for x in xs if x not in ("", None)),
}

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "%": lambda a, b: a % b,
}


def get_attr(value: Any, name: str) -> Any:
    if isinstance(value, (Ref, View)):
        return value.attr(name)
    if isinstance(value, dict):
        return value[name]
    raise Unknown(f".{name} of {value!r}")


def get_index(value: Any, key: Any) -> Any:
    if isinstance(key, Ref):
        raise Unknown(f"index {key}")
    if isinstance(value, (Ref, View)):
        return value.index(key)
    return value[key]


def known(value: Any) -> Any:
    if isinstance(value, (Ref, View)):
        raise Unknown(str(value))
    return value


def evaluate(node: Tree[Token], scope: dict[str, Any], lookup: Callable[[str], Any]) -> Any:
    """The value of an HCL expression: names from ``scope`` (for-expression and ``each``
    variables) or else from ``lookup`` (``var``, ``local``, ``module``, resource types)."""

    def ev(n: Tree[Token], s: dict[str, Any] = scope) -> Any:
        return evaluate(n, s, lookup)

    kind = node.data
    parts = trees(node)
    if kind in ("expr_term", "interpolation"):
        return ev(parts[0])
    if kind == "identifier":
        name = name_of(node)
        return scope[name] if name in scope else lookup(name)
    if kind == "literal_value":
        return {"true": True, "false": False, "null": None}[str(node.children[0])]
    if kind == "int_lit":
        return int(str(node.children[0]))
    if kind == "float_lit":
        return float(str(node.children[0]))
    if kind == "string":
        pieces = []
        for part in parts:
            (child,) = part.children
            pieces.append(render(ev(child)) if isinstance(child, Tree) else unescape(str(child)))
        return "".join(pieces)
    if kind in ("heredoc_template", "heredoc_template_trim"):
        return str(node.children[0])
    if kind == "get_attr_expr_term":
        return get_attr(ev(parts[0]), name_of(trees(parts[1])[0]))
    if kind == "index_expr_term":
        return get_index(ev(parts[0]), ev(trees(parts[1])[0]))
    if kind == "tuple":
        return [ev(p) for p in parts]
    if kind == "object":
        result = {}
        for elem in parts:
            key_node, value_node = trees(elem)
            (key_expr,) = trees(key_node)
            bare = trees(key_expr)
            bare_name = len(bare) == 1 and bare[0].data == "identifier"
            if key_expr.data == "expr_term" and bare_name and not has_token(key_expr, "("):
                result[name_of(bare[0])] = ev(value_node)  # a bare name is the key itself
                continue
            result[known(ev(key_expr))] = ev(value_node)
        return result
    if kind == "function_call":
        name = name_of(parts[0])
        args = trees(parts[1]) if len(parts) > 1 else []
        if name == "can":
            try:
                ev(args[0])
            except (ValueError, KeyError, IndexError, TypeError):
                return False
            return True
        if name == "try":
            for arg in args:
                try:
                    return ev(arg)
                except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                    continue
            raise ValueError("no argument of try() could be evaluated")
        values = [ev(a) for a in args]
        if any(isinstance(v, (Ref, View)) for v in values):
            # What a function makes of an unknown is unknown (Terraform's rule too).
            return Ref(f"{name}({', '.join(render(v) for v in values)})")
        if len(parts) > 1 and has_token(parts[1], "..."):
            values = values[:-1] + list(values[-1])
        return FUNCTIONS[name](*values)
    if kind == "conditional":
        test, yes, no = parts
        return ev(yes) if known(ev(test)) else ev(no)
    if kind == "binary_op":
        left, term = parts
        operator_node, right = trees(term)
        operator = str(operator_node.children[0])
        if operator == "&&":
            return bool(known(ev(left))) and bool(known(ev(right)))
        if operator == "||":
            return bool(known(ev(left))) or bool(known(ev(right)))
        return BINARY[operator](known(ev(left)), known(ev(right)))
    if kind == "unary_op":
        operator = str(node.children[0])
        value = known(ev(parts[0]))
        return (not value) if operator == "!" else -value
    if kind in ("for_tuple_expr", "for_object_expr"):
        intro, *body = parts
        condition = body[-1] if body and body[-1].data == "for_cond" else None
        if condition is not None:
            body = body[:-1]
        *names, collection = trees(intro)
        variables = [name_of(n) for n in names]
        tuple_result: list[Any] = []
        object_result: dict[Any, Any] = {}
        for key, value in iterate(ev(collection)):
            inner = dict(scope)
            if len(variables) == 2:
                inner[variables[0]], inner[variables[1]] = key, value
            else:
                inner[variables[0]] = value
            if condition is not None and not known(ev(trees(condition)[0], inner)):
                continue
            if kind == "for_tuple_expr":
                tuple_result.append(ev(body[0], inner))
            else:
                if has_token(node, "..."):
                    raise Unknown("grouping for-expressions are not used in infra/")
                object_result[known(ev(body[0], inner))] = ev(body[1], inner)
        return tuple_result if kind == "for_tuple_expr" else object_result
    raise NotImplementedError(f"HCL {kind} (extend the evaluator)")


# Terraform's configuration model, as far as these tests need it ------------------------------


@cache
def parse(path: Path) -> Tree[Token]:
    with path.open() as handle:
        return hcl2.parses_to_tree(handle.read())


@dataclass
class Block:
    kind: str
    labels: tuple[str, ...]
    body: Tree[Token]

    @property
    def attributes(self) -> dict[str, Tree[Token]]:
        found = {}
        for node in trees(self.body):
            if node.data == "attribute":
                name, value = trees(node)
                found[name_of(name)] = value
        return found

    @property
    def blocks(self) -> list[Block]:
        return [block_of(node) for node in trees(self.body) if node.data == "block"]


def block_of(node: Tree[Token]) -> Block:
    kind, *labels, body = trees(node)
    return Block(name_of(kind), tuple(name_of(label) for label in labels), body)


def file_blocks(path: Path) -> list[Block]:
    return [block_of(node) for node in trees(trees(parse(path))[0]) if node.data == "block"]


def apply_type(type_node: Tree[Token], value: Any, lookup: Callable[[str], Any]) -> Any:
    """``value`` converted to a variable's type as far as defaults go: the optional
    attributes of objects (``optional(T, default)``) that the value leaves out."""
    node = type_node
    while node.data == "expr_term":
        node = trees(node)[0]
    if node.data != "function_call" or value is None:
        return value
    name = name_of(trees(node)[0])
    args = trees(trees(node)[1])
    if name == "map":
        return {k: apply_type(args[0], v, lookup) for k, v in value.items()}
    if name in ("list", "set"):
        return [apply_type(args[0], v, lookup) for v in value]
    if name == "optional":
        return apply_type(args[0], value, lookup)
    if name == "object":
        fields = trees(trees(args[0])[0])
        result = dict(value)
        for elem in fields:
            key_node, field_type = trees(elem)
            key = name_of(trees(trees(key_node)[0])[0])
            inner = field_type
            while inner.data == "expr_term":
                inner = trees(inner)[0]
            is_optional = inner.data == "function_call" and name_of(trees(inner)[0]) == "optional"
            if key not in result and is_optional:
                optional_args = trees(trees(inner)[1])
                default = evaluate(optional_args[1], {}, lookup) if len(optional_args) > 1 else None
                result[key] = default
            if key in result:
                result[key] = apply_type(field_type, result[key], lookup)
        return result
    return value


# Resource id formats (the provider's "id: an identifier for the resource with format ...").
ID_FORMATS = {
    "google_pubsub_topic": "projects/{project}/topics/{name}",
    "google_pubsub_subscription": "projects/{project}/subscriptions/{name}",
    "google_eventarc_trigger": "projects/{project}/locations/{location}/triggers/{name}",
}


class Attributes(View):
    """A resource instance or a nested block, its attributes evaluated when read; what the
    configuration does not set is a reference (computed by the provider)."""

    def __init__(
        self, module: Module, path: str, block: Block, scope: dict[str, Any], kind: str = ""
    ) -> None:
        self.module, self.path, self.block = module, path, block
        self.scope, self.kind = scope, kind

    def __repr__(self) -> str:
        return f"<{self.path}>"

    def has(self, name: str) -> bool:
        return name in self.block.attributes or any(
            b.kind == name or (b.kind == "dynamic" and b.labels == (name,))
            for b in self.block.blocks
        )

    def attr(self, name: str) -> Any:
        attributes = self.block.attributes
        if name in attributes:
            return self.module.evaluate(attributes[name], self.scope)
        nested = [b for b in self.block.blocks if b.kind == name]
        dynamic = [b for b in self.block.blocks if b.kind == "dynamic" and b.labels == (name,)]
        if nested or dynamic:
            found: list[Attributes] = [
                Attributes(self.module, f"{self.path}.{name}[{i}]", b, self.scope)
                for i, b in enumerate(nested)
            ]
            for generator in dynamic:
                each = self.module.evaluate(generator.attributes["for_each"], self.scope)
                (content,) = [b for b in generator.blocks if b.kind == "content"]
                for key, value in iterate(each):
                    inner = {**self.scope, name: {"key": key, "value": value}}
                    path = f"{self.path}.{name}[{len(found)}]"
                    found.append(Attributes(self.module, path, content, inner))
            return found
        if self.kind in ID_FORMATS and name == "id":
            fields = {k: self.attr(k) for k in ("project", "name", "location") if self.has(k)}
            return ID_FORMATS[self.kind].format(**fields)
        return Ref(f"{self.path}.{name}")

    def index(self, key: object) -> Any:
        raise Unknown(f"{self.path}[{key!r}]")


class Namespace(View):
    def __init__(self, name: str, get: Callable[[str], Any]) -> None:
        self.name, self.get = name, get

    def __repr__(self) -> str:
        return self.name

    def attr(self, name: str) -> Any:
        return self.get(name)


class Module(View):
    """One module of infra/ with the arguments its caller gives it (each evaluated in the
    caller when read), or the root with a tfvars file's values."""

    def __init__(
        self, directory: Path, arguments: dict[str, Callable[[], Any]], address: str = ""
    ) -> None:
        self.directory, self.arguments, self.address = directory, arguments, address
        self.blocks = [b for path in sorted(directory.glob("*.tf")) for b in file_blocks(path)]
        self.local_expressions = {
            k: v for b in self.blocks if b.kind == "locals" for k, v in b.attributes.items()
        }
        self._vars: dict[str, Any] = {}
        self._locals: dict[str, Any] = {}
        self._modules: dict[str, Module] = {}

    def of(self, kind: str) -> dict[tuple[str, ...], Block]:
        return {b.labels: b for b in self.blocks if b.kind == kind}

    def lookup(self, name: str) -> Any:
        if name == "var":
            return Namespace("var", self.var)
        if name == "local":
            return Namespace("local", self.local)
        if name == "module":
            return Namespace("module", self.module)
        if name in {b.labels[0] for b in self.blocks if b.kind == "resource"}:
            return Namespace(name, lambda resource: self.resource(name, resource))
        return Ref(f"{self.address}{name}")

    def evaluate(self, node: Tree[Token], scope: dict[str, Any] | None = None) -> Any:
        return evaluate(node, scope or {}, self.lookup)

    def var(self, name: str) -> Any:
        if name not in self._vars:
            block = self.of("variable")[(name,)]
            if name in self.arguments:
                value = self.arguments[name]()
            elif "default" in block.attributes:
                value = self.evaluate(block.attributes["default"])
            else:
                raise KeyError(f"{self.directory.name}: variable {name} has no value")
            if "type" in block.attributes:
                value = apply_type(block.attributes["type"], value, self.lookup)
            self._vars[name] = value
        return self._vars[name]

    def local(self, name: str) -> Any:
        if name not in self._locals:
            self._locals[name] = self.evaluate(self.local_expressions[name])
        return self._locals[name]

    def validations(self, name: str) -> list[tuple[bool, str]]:
        """Each validation of variable ``name``: whether it holds, and its message."""
        block = self.of("variable")[(name,)]
        results = []
        for validation in (b for b in block.blocks if b.kind == "validation"):
            attributes = validation.attributes
            holds = bool(self.evaluate(attributes["condition"]))
            results.append((holds, str(self.evaluate(attributes["error_message"]))))
        return results

    def resource(self, kind: str, name: str) -> Any:
        """A resource: its instances by key (for_each), as a list (count), or the one."""
        block = self.of("resource")[(kind, name)]
        path = f"{self.address}{kind}.{name}"
        attributes = block.attributes
        if "for_each" in attributes:
            each = known(self.evaluate(attributes["for_each"]))
            if isinstance(each, list):
                each = {key: key for key in each}
            return {
                key: Attributes(
                    self, f"{path}[{json.dumps(key)}]", block,
                    {"each": {"key": key, "value": value}}, kind,
                )
                for key, value in iterate(each)
            }  # fmt: skip
        if "count" in attributes:
            count = known(self.evaluate(attributes["count"]))
            return [
                Attributes(self, f"{path}[{i}]", block, {"count": {"index": i}}, kind)
                for i in range(count)
            ]
        return Attributes(self, path, block, {}, kind)

    def module(self, name: str) -> Module:
        if name not in self._modules:
            block = self.of("module")[(name,)]
            source = str(self.evaluate(block.attributes["source"]))
            arguments: dict[str, Callable[[], Any]] = {
                key: partial(self.evaluate, value)
                for key, value in block.attributes.items()
                if key not in ("source", "count", "for_each", "depends_on", "providers")
            }
            directory = (self.directory / source).resolve()
            self._modules[name] = Module(directory, arguments, f"module.{name}.")
        return self._modules[name]

    def output(self, name: str) -> Any:
        return self.evaluate(self.of("output")[(name,)].attributes["value"])

    def attr(self, name: str) -> Any:
        return self.output(name)

    def index(self, key: object) -> Any:
        """``module.x[0]``: the one instance of a module called with ``count`` (the caller
        indexes it only where the count is one)."""
        if key != 0:
            raise Unknown(f"{self}[{key!r}]")
        return self

    def __repr__(self) -> str:
        return f"<{self.address or 'root'}>"


def tfvars(path: Path = EXAMPLE, **overrides: Any) -> dict[str, Any]:
    values = {
        name_of(trees(n)[0]): evaluate(trees(n)[1], {}, Ref)
        for n in trees(trees(parse(path))[0])
        if n.data == "attribute"
    }
    return {**values, **overrides}


def constant(value: Any) -> Callable[[], Any]:
    """A module argument whose value is already known."""
    return lambda: value


def root_with(**overrides: Any) -> Module:
    """infra/ as ``terraform plan`` would see it with the example's values and ``overrides``."""
    values = tfvars(**overrides)
    return Module(INFRA, {name: constant(value) for name, value in values.items()})


@cache
def example_root() -> Module:
    return root_with()


def instances(module: Module, kind: str, name: str) -> dict[str, Attributes]:
    found = module.resource(kind, name)
    assert isinstance(found, dict), f"{kind}.{name} is made with for_each"
    return found


def example_tenants() -> dict[str, dict[str, list[str]]]:
    tenants: dict[str, dict[str, list[str]]] = example_root().var("tenants")
    return tenants


def account(key: str, attribute: str) -> Ref:
    """A function's service account's email or IAM member (module.identities)."""
    return Ref(f'module.identities.google_service_account.account["{key}"].{attribute}')


CI_HOOK = account("ci_hook", "member")
TRIGGER_ACCOUNT = account("trigger", "email")


# The example -----------------------------------------------------------------------------------


def test_the_example_has_two_tenants_with_their_own_principals() -> None:
    tenants = example_tenants()
    assert set(tenants) == {"vision", "speech"}
    vision, speech = tenants["vision"], tenants["speech"]
    for spec in (vision, speech):
        assert spec["publishers"]
        assert spec["subscribers"]
    assert not set(vision["publishers"]) & set(speech["publishers"])
    assert not set(vision["subscribers"]) & set(speech["subscribers"])
    admins = example_root().var("admins")
    assert admins
    assert not set(admins) & {m for t in tenants.values() for m in t["publishers"]}
    assert example_root().var("shared_requests_topic") is False


# Request topics --------------------------------------------------------------------------------


def request_topics(root: Module) -> dict[str, str]:
    topics = instances(root.module("pubsub"), "google_pubsub_topic", "requests")
    return {key: topic.attr("name") for key, topic in topics.items()}


def publishers_by_topic(root: Module) -> dict[str, set[object]]:
    """Who holds roles/pubsub.publisher on each request topic, by topic name."""
    pubsub = root.module("pubsub")
    names = request_topics(root)
    found: dict[str, set[object]] = {name: set() for name in names.values()}
    bindings = instances(pubsub, "google_pubsub_topic_iam_member", "request_publisher")
    for binding in bindings.values():
        assert binding.attr("role") == "roles/pubsub.publisher"
        # The binding's topic is the topic resource's name (so the binding follows it).
        topic = binding.attr("topic")
        assert topic in found, topic
        found[topic].add(binding.attr("member"))
    return found


def test_each_tenant_of_the_example_gets_its_own_request_topic_and_the_admins_theirs() -> None:
    topics = request_topics(example_root())
    assert topics == {
        "vision": tenant_topic("vision"),
        "speech": tenant_topic("speech"),
        "admin": ADMIN_TOPIC,
    }


def test_the_shared_topic_is_absent_by_default_and_trusts_request_publishers_when_on() -> None:
    """Off by default (issue 15): every publisher of the shared topic could claim any tenant.
    On, it exists with ``request_publishers`` as its publishers — not the CI hook, which
    publishes on the tenant's own topic."""
    assert SHARED_TOPIC not in request_topics(example_root()).values()
    assert SHARED_TOPIC not in example_root().module("pubsub").output("topics").values()
    members = ["group:small-team@example.com"]
    shared = root_with(shared_requests_topic=True, request_publishers=members)
    assert request_topics(shared)["shared"] == SHARED_TOPIC
    assert publishers_by_topic(shared)[SHARED_TOPIC] == set(members)
    assert shared.module("pubsub").output("topics")["requests"] == SHARED_TOPIC
    # request_publishers alone does not make it.
    assert SHARED_TOPIC not in request_topics(root_with(request_publishers=members)).values()


def test_each_tenant_topic_admits_that_tenants_publishers_and_the_ci_hook_only() -> None:
    """roles/pubsub.publisher on a topic is what lets a principal publish there
    (pubsub/docs/access-control); intake takes the tenant from the topic, so a tenant's topic
    must admit its own principals and the CI hook (which publishes for the tenant of the CI
    mapping it matched) and no one else."""
    publishers = publishers_by_topic(example_root())
    tenants = example_tenants()
    for tenant, spec in tenants.items():
        assert publishers[tenant_topic(tenant)] == {*spec["publishers"], CI_HOOK}, tenant
    assert publishers[ADMIN_TOPIC] == set(example_root().var("admins"))
    assert CI_HOOK not in publishers[ADMIN_TOPIC]


def test_no_principal_may_publish_on_another_tenants_topic() -> None:
    publishers = publishers_by_topic(example_root())
    tenants = example_tenants()
    for tenant, spec in tenants.items():
        for member in spec["publishers"]:
            elsewhere = [
                topic for topic, members in publishers.items()
                if member in members and topic != tenant_topic(tenant)
            ]  # fmt: skip
            assert not elsewhere, f"{member} of {tenant} may publish on {elsewhere}"


def test_nothing_else_grants_publishing_on_a_request_topic() -> None:
    """Only the per-topic bindings above: no other IAM resource in infra/ names a request
    topic, none is authoritative (an ``_iam_binding`` or ``_iam_policy`` on a topic would drop
    the tenants' grants), and no account holds a Pub/Sub role on the whole project (which would
    let it publish on every topic)."""
    naming_requests = []
    for path in sorted(INFRA.glob("*.tf")) + sorted(MODULES.glob("*/*.tf")):
        with path.open() as handle:
            document = hcl2.load(handle)
        for entry in document.get("resource", []):
            for quoted, named in entry.items():
                kind = quoted.strip('"')
                for name, body in named.items():
                    if not kind.startswith("google_pubsub_topic_iam"):
                        continue
                    assert kind == "google_pubsub_topic_iam_member", f"{path}: {kind}"
                    if re.search(r"google_pubsub_topic\.requests\[", str(body["topic"])):
                        naming_requests.append((path.name, name.strip('"')))
    assert naming_requests == [("main.tf", "request_publisher")]
    for key, roles in example_root().local("project_roles").items():
        assert not [r for r in roles if str(r).startswith("roles/pubsub.")], key


def test_tenant_names_fit_the_topic_and_trigger_names_and_exclude_admin_and_shared() -> None:
    """A tenant's name becomes capacity-requests-{tenant} (a topic's id "must start with a
    letter" and be "between 3 and 255 characters": pubsub/docs/admin#resource_names) and the
    Eventarc trigger opendws-intake-from-{tenant}; it must also be a request's ``tenant``
    (opendws.schema.request: ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``)."""
    from opendws.schema.request import _NAME

    def holds(names: list[str], **spec: list[str]) -> bool:
        tenants = {name: {"publishers": [], "subscribers": [], **spec} for name in names}
        return all(ok for ok, _ in root_with(tenants=tenants).validations("tenants"))

    good = ["vision", "speech", "a", "team-2", "9lives", "x" * 40]
    bad = ["Vision", "x" * 41, "admin", "shared", "-x", "x-", "a_b", "a.b", ""]
    for name in good:
        assert holds([name]), name
        assert re.fullmatch(_NAME, name)
        assert len(f"opendws-intake-from-{name}") <= 63
    for name in bad:
        assert not holds([name]), name
    assert not holds(["vision"], publishers=["allUsers"])
    assert not holds(["vision"], subscribers=["allAuthenticatedUsers"])
    admins_ok = root_with(admins=["allUsers"]).validations("admins")
    assert not all(ok for ok, _ in admins_ok)
    assert not all(ok for ok, _ in root_with(api_tenants=["admin"]).validations("api_tenants"))


def test_a_tenant_given_without_lists_gets_empty_ones() -> None:
    """``optional(list(string), [])``: a tenant named with no publishers has a topic only the
    CI hook publishes on, and a subscription nobody reads."""
    root = root_with(tenants={"vision": {}})
    assert root.var("tenants") == {"vision": {"publishers": [], "subscribers": []}}
    assert publishers_by_topic(root)[tenant_topic("vision")] == {CI_HOOK}


# Events ----------------------------------------------------------------------------------------


def test_each_tenant_reads_its_events_from_a_subscription_filtered_on_its_tenant() -> None:
    """pubsub/docs/subscription-message-filter: ``attributes.KEY = "VALUE"`` delivers only the
    messages with that attribute; Pub/Sub acknowledges the others itself. The filter cannot be
    changed after creation, and the official emulator ignores it, so it is pinned here."""
    pubsub = example_root().module("pubsub")
    subscriptions = instances(pubsub, "google_pubsub_subscription", "tenant_events")
    events_id = instances(pubsub, "google_pubsub_topic", "topic")["events"].attr("id")
    assert events_id == f"projects/my-ml-project/topics/{EVENTS_TOPIC}"
    assert set(subscriptions) == set(example_tenants())
    for tenant, subscription in subscriptions.items():
        assert subscription.attr("name") == f"capacity-events-{tenant}"
        assert subscription.attr("topic") == events_id
        assert subscription.attr("filter") == f'attributes.tenant = "{tenant}"'
        # An idle subscription would expire after 31 days (and its grants with it).
        (expiration,) = subscription.attr("expiration_policy")
        assert expiration.attr("ttl") == ""
    ports = pytest.importorskip("opendws.ports")
    event_filter = getattr(ports, "event_filter", None)
    if event_filter is not None:
        for tenant, subscription in subscriptions.items():
            assert subscription.attr("filter") == event_filter(tenant)


def test_events_carry_the_tenant_attribute_the_filters_read() -> None:
    """The event bus publishes ``tenant`` as a message attribute (not only in the body):
    a filter reads attributes only."""
    import ast

    source = (ROOT / "shared" / "opendws" / "adapters" / "pubsub.py").read_text()
    (bus,) = [
        node for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "PubSubEventBus"
    ]  # fmt: skip
    publishes = [
        node for node in ast.walk(bus)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "publish"
    ]  # fmt: skip
    assert any("tenant" in {k.arg for k in call.keywords} for call in publishes)


def test_tenant_subscribers_hold_their_subscription_only_and_operators_the_topic() -> None:
    """A tenant's subscribers get roles/pubsub.subscriber on its subscription, which lets them
    pull and acknowledge there only. The operators (``event_subscribers``) keep the role on
    the unfiltered topic, which lets them attach subscriptions to it and see every tenant's
    events (pubsub/docs/access-control: attaching a subscription to a topic needs
    pubsub.topics.attachSubscription on the topic)."""
    pubsub = example_root().module("pubsub")
    subscriptions = instances(pubsub, "google_pubsub_subscription", "tenant_events")
    bindings = instances(pubsub, "google_pubsub_subscription_iam_member", "tenant_event_subscriber")
    by_tenant: dict[str, set[str]] = {}
    for binding in bindings.values():
        assert binding.attr("role") == "roles/pubsub.subscriber"
        subscription = binding.attr("subscription")
        tenant = subscription.removeprefix("capacity-events-")
        assert subscription == subscriptions[tenant].attr("name")
        by_tenant.setdefault(tenant, set()).add(binding.attr("member"))
    tenants = example_tenants()
    assert by_tenant == {t: set(spec["subscribers"]) for t, spec in tenants.items()}
    operators = instances(pubsub, "google_pubsub_topic_iam_member", "event_subscriber")
    assert {b.attr("member") for b in operators.values()} == set(
        example_root().var("event_subscribers")
    )
    for binding in operators.values():
        assert binding.attr("topic") == EVENTS_TOPIC
    tenant_readers = {m for spec in tenants.values() for m in spec["subscribers"]}
    assert not tenant_readers & set(example_root().var("event_subscribers"))


# Intake reads every request topic ----------------------------------------------------------------


def intake_topics(root: Module) -> dict[str, object]:
    """The topic (id) of each of intake's triggers: the function's own, and its Eventarc
    triggers'."""
    intake = root.module("intake")
    function = intake.resource("google_cloudfunctions2_function", "this")
    (own,) = function.attr("event_trigger")
    topics = {"(function)": own.attr("pubsub_topic")}
    for key, trigger in instances(intake, "google_eventarc_trigger", "more").items():
        (transport,) = trigger.attr("transport")
        (pubsub,) = transport.attr("pubsub")
        topics[key] = pubsub.attr("topic")
    return topics


def test_intake_receives_every_request_topic_and_only_those() -> None:
    """A gen2 function has one event trigger; every further topic gets a
    ``google_eventarc_trigger`` to the function's Cloud Run service (terraform-provider-google
    website/docs/r/eventarc_trigger: ``transport.pubsub.topic`` "You may set an existing topic
    for triggers of the type google.cloud.pubsub.topic.v1.messagePublished"; ``destination.
    cloud_function`` is output only — "Creating Cloud Functions V2 triggers is only supported
    via the Cloud Functions product" — so the destination is ``cloud_run_service``)."""
    for root in (example_root(), root_with(shared_requests_topic=True)):
        topics = intake_topics(root)
        expected = {
            f"projects/my-ml-project/topics/{name}" for name in request_topics(root).values()
        }
        assert set(topics.values()) == expected
        assert len(topics) == len(expected)  # one trigger per topic
        assert topics["(function)"] == f"projects/my-ml-project/topics/{ADMIN_TOPIC}"


def test_each_trigger_delivers_a_cloudevent_whose_source_names_its_topic() -> None:
    """Eventarc delivers a Pub/Sub message as a CloudEvent of type
    google.cloud.pubsub.topic.v1.messagePublished whose ``source`` is
    ``//pubsub.googleapis.com/projects/PROJECT/topics/TOPIC`` (eventarc/docs/cloudevents), the
    same for the function's own trigger and for the Eventarc triggers: intake reads the tenant
    from it."""
    ports = pytest.importorskip("opendws.ports")
    topic_of_source = getattr(ports, "topic_of_source", None)
    identity_of_topic = getattr(ports, "identity_of_topic", None)
    if topic_of_source is None or identity_of_topic is None:
        pytest.skip("opendws.ports does not read a topic's identity yet")
    tenants = sorted(example_tenants())
    seen = {}
    for topic_id in intake_topics(root_with(shared_requests_topic=True)).values():
        source = f"//pubsub.googleapis.com/{topic_id}"
        topic = topic_of_source(source)
        seen[topic] = identity_of_topic(topic, tenants, shared_trusted=True)
    assert {t: (i.speaker.value, i.tenant) for t, i in seen.items()} == {
        tenant_topic("vision"): ("TENANT", "vision"),
        tenant_topic("speech"): ("TENANT", "speech"),
        ADMIN_TOPIC: ("ADMIN", None),
        SHARED_TOPIC: ("SHARED", None),
    }


def test_the_eventarc_triggers_are_those_google_documents_for_pubsub_to_cloud_run() -> None:
    """eventarc/docs/run/route-trigger-cloud-pubsub and eventarc/docs/roles-permissions: the
    event type filter, the existing topic as transport, the Cloud Run service and its region,
    and a service account with roles/run.invoker on the service (no eventarc.eventReceiver:
    "You don't need to grant the role if you are routing direct events from Cloud Pub/Sub")."""
    intake = example_root().module("intake")
    triggers = instances(intake, "google_eventarc_trigger", "more")
    assert set(triggers) == set(example_tenants())
    names = set()
    for key, trigger in triggers.items():
        names.add(trigger.attr("name"))
        assert trigger.attr("name") == f"opendws-intake-from-{key}"
        (criterion,) = trigger.attr("matching_criteria")
        assert criterion.attr("attribute") == "type"
        assert criterion.attr("value") == MESSAGE_PUBLISHED
        (destination,) = trigger.attr("destination")
        (service,) = destination.attr("cloud_run_service")
        # The service's own name, from the function's service_config.service (a resource
        # name, projects/P/locations/R/services/S; see the next test).
        function_service = "google_cloudfunctions2_function.this.service_config[0].service"
        assert function_service in str(service.attr("service"))
        assert service.attr("region") == "us-central1"
        assert trigger.attr("location") == "us-central1"
        assert trigger.attr("service_account") == TRIGGER_ACCOUNT
        # Intake retries (its faults are transient): no retry_policy, so Eventarc retries
        # as Pub/Sub does (eventarc/docs/retry-events).
        assert trigger.attr("retry_policy") == []
    assert len(names) == len(triggers)
    assert account("trigger", "member") in intake.var("invokers")
    # The function's own trigger runs as the same account.
    function = intake.resource("google_cloudfunctions2_function", "this")
    (own,) = function.attr("event_trigger")
    assert own.attr("service_account_email") == TRIGGER_ACCOUNT
    assert own.attr("event_type") == MESSAGE_PUBLISHED
    assert own.attr("retry_policy") == "RETRY_POLICY_RETRY"


def test_the_service_name_is_the_last_segment_of_the_functions_service() -> None:
    intake = example_root().module("intake")
    expression = intake.local_expressions["service_name"]
    service = "projects/p/locations/us-central1/services/opendws-intake"
    value = evaluate(
        expression, {}, lambda name: {
            "google_cloudfunctions2_function": {"this": {"service_config": [{"service": service}]}}
        }[name],
    )  # fmt: skip
    assert value == "opendws-intake"


def test_a_function_that_does_not_retry_gets_eventarc_triggers_that_do_not_either() -> None:
    """``retry_policy.max_attempts``: "The maximum number of delivery attempts for any
    message. The only valid value is 1" (website/docs/r/eventarc_trigger)."""
    arguments = {
        "project": "p", "region": "r", "name": "f", "description": "d", "entry_point": "e",
        "source_bucket": "b", "source_object": "o", "service_account_email": "s",
        "pubsub_trigger": {"topic": "t", "service_account_email": "a", "retry": False},
        "more_pubsub_topics": {"x": "projects/p/topics/x"},
    }  # fmt: skip
    module = Module(
        MODULES / "function", {k: constant(v) for k, v in arguments.items()}, "module.f."
    )
    (trigger,) = instances(module, "google_eventarc_trigger", "more").values()
    (policy,) = trigger.attr("retry_policy")
    assert policy.attr("max_attempts") == 1


def test_every_trigger_subscription_gets_the_dead_letter_policy() -> None:
    """Eventarc makes each trigger's subscription, and a dead-letter topic can be set only on
    a subscription, by updating it (eventarc/docs/retry-events, "Dead letter topics"); the
    trigger resource names its subscription (``transport.pubsub.subscription``, output)."""
    intake = example_root().module("intake")
    triggers = instances(intake, "google_eventarc_trigger", "more")
    dead_letters = instances(intake, "terraform_data", "more_dead_letter")
    assert set(dead_letters) == set(triggers)
    for key, data in dead_letters.items():
        replace = data.attr("triggers_replace")
        subscription = Ref(
            f'module.intake.google_eventarc_trigger.more["{key}"].transport[0].pubsub[0]'
            ".subscription"
        )
        assert subscription in replace
        (provisioner,) = data.attr("provisioner")
        environment = provisioner.attr("environment")
        assert environment["DEAD_LETTER_TOPIC"] == (
            "projects/my-ml-project/topics/capacity-requests-dead-letter"
        )
        command = provisioner.attr("command")
        assert "${local.dead_letter_command}" in command
    command = str(intake.local("dead_letter_command"))
    assert "--dead-letter-topic" in command
    assert "roles/pubsub.subscriber" in command  # Pub/Sub's agent acknowledges what it forwards
    # And none without a dead-letter policy.
    off = root_with(dead_letter_max_delivery_attempts=None).module("intake")
    assert instances(off, "terraform_data", "more_dead_letter") == {}


# The API keeps its tenants ---------------------------------------------------------------------


def test_api_tenants_still_make_the_api_keys() -> None:
    """``api_tenants`` keeps its meaning (who gets an API key); the tenants' topics do not
    make keys."""
    secrets = example_root().module("secrets")
    assert secrets.var("api_tenants") == ["vision", "speech", "ci"]
    assert secrets.local("api_tenants") == ["vision", "speech", "ci", "admin"]


# Documentation ---------------------------------------------------------------------------------


def test_the_readme_says_who_is_trusted_for_what() -> None:
    readme = (INFRA / "README.md").read_text()
    section = readme.split("## Who is trusted for what", 1)[1].split("\n## ", 1)[0]
    phrases = ["capacity-requests-{tenant}", ADMIN_TOPIC, "shared_requests_topic",
               "capacity-events-{tenant}", "event_subscribers", "admins", "tenants"]  # fmt: skip
    for phrase in phrases:
        assert phrase in section, phrase


# Terraform agrees ------------------------------------------------------------------------------


def terraform_console(directory: Path, expressions: list[str]) -> list[Any]:
    values = []
    for expression in expressions:
        run = subprocess.run(
            ["terraform", "console"], input=f"jsonencode({expression})\n", cwd=directory,
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        values.append(json.loads(json.loads(run.stdout.strip().splitlines()[-1])))
    return values


def locals_only(source: Path) -> str:
    """A module's locals blocks, as written (they reference variables only)."""
    text = source.read_text()
    return "\n".join(m.group(0) for m in re.finditer(r"^locals \{.*?^\}", text, re.S | re.M))


def plain(value: Any) -> Any:
    if isinstance(value, Ref):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
@pytest.mark.parametrize("shared", [False, True])
def test_terraform_console_computes_the_same_topics_bindings_and_filters(
    tmp_path: Path, shared: bool
) -> None:
    root = root_with(shared_requests_topic=shared, request_publishers=["group:s@example.com"])
    pubsub = root.module("pubsub")
    (tmp_path / "variables.tf").write_text((MODULES / "pubsub" / "variables.tf").read_text())
    (tmp_path / "locals.tf").write_text(locals_only(MODULES / "pubsub" / "main.tf"))
    inputs = {name: plain(pubsub.var(name)) for (name,) in pubsub.of("variable")}
    (tmp_path / "terraform.tfvars.json").write_text(json.dumps(inputs))
    names = ["request_topics", "request_publisher_bindings", "event_subscriptions",
             "event_subscriber_bindings", "publisher_bindings"]  # fmt: skip
    computed = terraform_console(tmp_path, [f"local.{name}" for name in names])
    for name, value in zip(names, computed, strict=True):
        assert value == plain(pubsub.local(name)), name


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
def test_terraform_console_applies_the_same_tenant_validations(tmp_path: Path) -> None:
    (tmp_path / "variables.tf").write_text((INFRA / "variables.tf").read_text())
    (tmp_path / "terraform.tfvars").write_text(EXAMPLE.read_text())
    (tenants,) = terraform_console(tmp_path, ["var.tenants"])
    assert tenants == example_tenants()
    for bad in ("{admin = {}}", "{Vision = {}}", '{"x-" = {}}'):
        run = subprocess.run(
            ["terraform", "console", f"-var=tenants={bad}"], input="var.tenants\n",
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        # terraform console reports the refused value and still exits 0.
        output = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
        assert "Invalid value for variable" in output, bad
