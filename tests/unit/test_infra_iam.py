"""infra/ grants each function's service account what its code calls on Google, and no more;
and the functions are built as a service account Terraform makes for it.

infra/README.md's table "Each Google call and the role it needs" is the one list: every Google
call opendws makes, the permission it needs, the role that holds it, where that role is granted
and to which functions' accounts. Two tests hold it true both ways: the Terraform (evaluated
with the HCL evaluator of tests/unit/test_infra_tenants.py) grants exactly the table's roles to
exactly its functions, and the table names every Google client method the adapters call
(found in their source, not listed by hand).

Sources: firestore/docs/security/iam ("Required permissions for API methods": batchGet
datastore.entities.get, beginTransaction datastore.databases.get, commit
datastore.entities.create/update/delete, runQuery datastore.entities.list);
monitoring/access-control (roles/monitoring.metricWriter: monitoring.timeSeries.create and
monitoring.metricDescriptors.create, what OpenTelemetry's Cloud Monitoring exporter calls);
pubsub/docs/access-control; tasks/docs/reference-access-control (creating a task with an OIDC
token needs iam.serviceAccounts.actAs on its account); functions/docs/securing/build-custom-sa,
run/docs/configuring/services/build-service-account and magic-modules
``mmv1/templates/terraform/examples/cloudfunctions2_basic_builder.tf.tmpl`` (the build
account)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_infra_tenants import INFRA, Attributes, Module, Ref, known, root_with

ROOT = INFRA.parent
ADAPTERS = ROOT / "shared" / "opendws" / "adapters"
README = INFRA / "README.md"
SECTION = "## Each Google call and the role it needs"
FUNCTIONS = ("intake", "reconcile", "timer", "ci_hook", "api", "agent")
# Tenants' secret prefixes (the scheduler's configuration's secret_prefix), one naming this
# project by id and one another project by number: the agent function reads their secrets.
SECRET_PREFIXES = {
    "vision": "projects/my-ml-project/secrets/vision-",
    "speech": "projects/123456789012/secrets/speech-",
}

# The secrets the CI mappings name (a GitHub App's key, a GitLab token), in two projects.
CI_SECRETS = [
    "projects/my-ml-project/secrets/github-app-key",
    "projects/123456789012/secrets/gitlab_runner-token",
]

# Where an IAM member resource grants its role.
GRANTED_ON = {
    "google_project_iam_member": "project",
    "google_pubsub_topic_iam_member": "topic",
    "google_pubsub_subscription_iam_member": "subscription",
    "google_cloud_tasks_queue_iam_member": "queue",
    "google_secret_manager_secret_iam_member": "secret",
    "google_service_account_iam_member": "service account",
    "google_cloud_run_service_iam_member": "service",
    "google_iap_web_backend_service_iam_member": "backend service",
}
# A function's account, as module.identities makes it (member, or email in a member string).
ACCOUNT = re.compile(r'google_service_account\.account\["(\w+)"\]\.(?:member|email)')

# Roles Google documents for a function's build account (run/docs/configuring/services/
# build-service-account, and Google's own example of a gen2 function with a build account,
# magic-modules cloudfunctions2_basic_builder.tf.tmpl): build logs, the built image, the source.
BUILD_ROLES = {
    "roles/logging.logWriter",
    "roles/artifactregistry.writer",
    "roles/storage.objectAdmin",
}


# The table -------------------------------------------------------------------------------------


def table_rows() -> list[dict[str, str]]:
    """The rows of the README's table, by column (call, permission, role, on, functions)."""
    text = README.read_text()
    assert SECTION in text, f"infra/README.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    header = [cell.strip().lower() for cell in lines[0].strip("|").split("|")]
    assert header == ["call", "permission", "role", "on", "functions"], header
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert len(cells) == len(header), line
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def table_grants() -> set[tuple[str, str, str]]:
    """(function, role, where) for every grant the table names."""
    grants = set()
    for row in table_rows():
        roles = re.findall(r"roles/[\w.]+", row["role"])
        if not roles:
            assert row["functions"] in ("—", ""), f"{row['call']}: functions but no role"
            continue
        (role,) = roles
        on = next((kind for kind in sorted(GRANTED_ON.values(), key=len, reverse=True)
                   if row["on"].startswith(kind)), None)  # fmt: skip
        assert on is not None, f"{row['call']}: 'on' must start with one of {GRANTED_ON.values()}"
        functions = re.findall(r"\w+", row["functions"])
        assert functions, row["call"]
        assert set(functions) <= set(FUNCTIONS), row["functions"]
        grants |= {(function, role, on) for function in functions}
    return grants


# The Terraform ---------------------------------------------------------------------------------


def instances_of(module: Module, kind: str, name: str) -> list[Attributes]:
    """A resource's instances (as Module.resource, also where a for_each key is a reference
    only Google knows, such as a service account's member)."""
    block = module.of("resource")[(kind, name)]
    path = f"{module.address}{kind}.{name}"
    if "for_each" in block.attributes:
        each = known(module.evaluate(block.attributes["for_each"]))
        pairs = [(key, key) for key in each] if isinstance(each, list) else list(each.items())
        return [
            Attributes(
                module, f"{path}[{key}]", block, {"each": {"key": key, "value": value}}, kind
            )
            for key, value in pairs
        ]
    return (
        [
            Attributes(module, f"{path}[{index}]", block, {"count": {"index": index}}, kind)
            for index in range(known(module.evaluate(block.attributes["count"])))
        ]
        if "count" in block.attributes
        else [Attributes(module, path, block, {}, kind)]
    )


def modules_of(root: Module) -> Iterator[Module]:
    yield root
    for (name,), block in root.of("module").items():
        if "count" in block.attributes and known(root.evaluate(block.attributes["count"])) == 0:
            continue
        yield root.module(name)


def terraform_grants(root: Module) -> set[tuple[str, str, str]]:
    """(function, role, where) for every IAM member resource that names a function's account."""
    grants = set()
    for module in modules_of(root):
        for kind, name in module.of("resource"):
            if not kind.endswith("_iam_member"):
                continue
            for grant in instances_of(module, kind, name):
                member = str(grant.attr("member"))
                account = ACCOUNT.search(member)
                if account is None or account[1] not in FUNCTIONS:
                    continue
                assert kind in GRANTED_ON, f"{kind}.{name}: where does it grant?"
                grants.add((account[1], str(grant.attr("role")), GRANTED_ON[kind]))
    return grants


def with_a_vm_account() -> Module:
    """The example, with a flex pool whose VMs run as a service account (the functions that
    make and delete them must act as it), tenants whose runs may name secrets, and CI mappings
    naming theirs."""
    pool = {
        "shape": "a3-highgpu-8g",
        "service_account": "vms@my-ml-project.iam.gserviceaccount.com",
    }
    return root_with(
        flex_pools=[pool], tenant_secret_prefixes=SECRET_PREFIXES, ci_secrets=CI_SECRETS
    )


def test_terraform_grants_each_function_the_roles_of_the_table_and_no_others() -> None:
    """Both ways: every role the table names is granted to that function's account where the
    table says, and no grant to a function's account is missing from the table. The api and
    the CI hook export their metrics to Cloud Monitoring as the others do
    (OPENDWS_METRICS_EXPORT in every function's environment), which takes
    roles/monitoring.metricWriter."""
    expected = table_grants()
    assert ("api", "roles/monitoring.metricWriter", "project") in expected
    assert ("ci_hook", "roles/monitoring.metricWriter", "project") in expected
    granted = terraform_grants(with_a_vm_account())
    missing = sorted(expected - granted)
    extra = sorted(granted - expected)
    assert not missing, f"the table names grants Terraform does not make: {missing}"
    assert not extra, f"Terraform grants what the table does not name: {extra}"
    # Without such a pool the same functions act as the timers' account (modules/tasks).
    assert terraform_grants(root_with(tenant_secret_prefixes=SECRET_PREFIXES)) == expected
    # Without secret prefixes no tenant's run may name a secret, and the agent reads none. (It
    # reads the session key on its secret, so secretAccessor on a secret stays without CI
    # secrets: the test below holds the CI secrets' grants.)
    assert terraform_grants(root_with()) == expected - {
        ("agent", "roles/secretmanager.secretAccessor", "project")
    }


def test_the_agent_and_reconcile_functions_alone_read_the_ci_mappings_secrets() -> None:
    """The CI mappings' GitHub App keys and GitLab tokens: secretAccessor for the agent
    function (which mints the runners) and the reconcile function (whose sweep deletes idle
    runners), each on each secret ``ci_secrets`` names, in its project, and on nothing wider;
    no other function (the CI hook among them) is granted any of them.
    ``google_secret_manager_secret_iam_member`` takes the secret's id as ``secret_id`` and its
    project as ``project``, as magic-modules documents it
    (mmv1/templates/terraform/resource_iam.html.markdown.tmpl, with
    mmv1/products/secretmanager/Secret.yaml: ``iam_policy.parent_resource_attribute:
    secret_id``, ``projects/{{project}}/secrets/{{secret_id}}``)."""
    root = with_a_vm_account()
    grants = instances_of(root, "google_secret_manager_secret_iam_member", "reads_ci_secrets")
    read: set[tuple[str, str]] = set()
    for grant in grants:
        assert grant.attr("role") == "roles/secretmanager.secretAccessor"
        account = ACCOUNT.search(str(grant.attr("member")))
        assert account is not None
        secret = f"projects/{grant.attr('project')}/secrets/{grant.attr('secret_id')}"
        read.add((account[1], secret))
    assert read == {(reader, secret) for reader in ("agent", "reconcile") for secret in CI_SECRETS}
    # Every secret-level grant naming a CI secret is one of those.
    for module in modules_of(root):
        for kind, name in module.of("resource"):
            if kind != "google_secret_manager_secret_iam_member":
                continue
            for grant in instances_of(module, kind, name):
                secret = f"projects/{grant.attr('project')}/secrets/{grant.attr('secret_id')}"
                if secret in CI_SECRETS:
                    assert name == "reads_ci_secrets", (kind, name)
    assert instances_of(root_with(), "google_secret_manager_secret_iam_member",
                        "reads_ci_secrets") == []  # fmt: skip


@pytest.mark.parametrize(
    "name",
    [
        "projects/my-ml-project/secrets/github-app-key/versions/3",
        "projects/my-ml-project/secrets/",
        "github-app-key",
        "projects/My_Project/secrets/github-app-key",
        "projects/my-ml-project/secrets/github.app.key",
    ],
)
def test_a_ci_secret_that_is_not_a_secrets_resource_name_is_refused(name: str) -> None:
    """Secret Manager's secret names: projects/PROJECT/secrets/SECRET_ID, an id of letters,
    digits, dashes and underscores (secret-manager/docs/reference/rest/v1/projects.secrets/
    create, ``secretId``); a version name is refused with a word on dropping the version."""
    assert all(ok for ok, _ in root_with(ci_secrets=CI_SECRETS).validations("ci_secrets"))
    assert not all(ok for ok, _ in root_with(ci_secrets=[name]).validations("ci_secrets"))


# The adapters' Google calls --------------------------------------------------------------------

# Firestore methods that send a request (a read, a query, a write or a commit), and those that
# only build a reference or a query, or read a snapshot already fetched.
FIRESTORE_REQUESTS = frozenset(
    {"get", "get_all", "create", "set", "update", "delete", "stream", "commit"}
)
FIRESTORE_LOCAL = frozenset(
    {
        "collection",
        "collection_group",
        "document",
        "where",
        "order_by",
        "limit",
        "batch",
        "transaction",
        "to_dict",
    }
)


def google_class(namespace: dict[str, Any], annotation: ast.expr | None) -> type | None:
    """The Google client library class an annotation names (``compute_v1.InstancesClient |
    None``), if any."""
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, (ast.Name, ast.Attribute)):
            try:
                value = eval(ast.unparse(node), namespace)  # a name of the module
            except (NameError, AttributeError):
                continue
            if inspect.isclass(value) and value.__module__.startswith("google.cloud."):
                return value
    return None


def self_attribute(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr if node.value.id == "self" else None
    return None


def client_attributes(tree: ast.Module, namespace: dict[str, Any]) -> dict[str, tuple[type, str]]:
    """``self._x`` => (its client class, the expression it was made from), for each attribute
    an ``__init__`` sets from a parameter annotated with a Google client class (directly, or
    from a call on it: ``client.collection(...)``)."""
    found: dict[str, tuple[type, str]] = {}
    for init in ast.walk(tree):
        if not (isinstance(init, ast.FunctionDef) and init.name == "__init__"):
            continue
        arguments = init.args.args + init.args.kwonlyargs
        params = {a.arg: google_class(namespace, a.annotation) for a in arguments}
        for node in ast.walk(init):
            if not isinstance(node, ast.Assign):
                continue
            root = root_name(node.value)
            client = params.get(root) if root else None
            for target in node.targets:
                if client is not None and (attribute := self_attribute(target)):
                    found[attribute] = (client, ast.unparse(node.value))
    return found


def root_name(node: ast.AST) -> str | None:
    """The name an expression's chain of attributes, calls and subscripts starts from
    (``self._x`` for ``self._x.a(b).c``)."""
    while True:
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return f"self.{node.attr}"
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def firestore_calls(tree: ast.Module, roots: set[str]) -> set[str]:
    """Methods called on Firestore objects: those made from ``roots`` (the client's
    attributes), parameters annotated with a Firestore class, and names assigned from them or
    iterated over them, method by method; plus ``transactional`` for ``@firestore.
    transactional``."""
    calls: set[str] = set()
    for method in ast.walk(tree):
        if not isinstance(method, ast.FunctionDef):
            continue
        tainted = set(roots)
        for node in ast.walk(method):
            if not isinstance(node, ast.arg) or node.annotation is None:
                continue
            if "firestore." in ast.unparse(node.annotation):
                tainted.add(node.arg)
        changed = True
        while changed:
            changed = False
            for node in ast.walk(method):
                if isinstance(node, ast.Assign):
                    sources, targets = node.value, node.targets
                elif isinstance(node, ast.For):
                    sources, targets = node.iter, [node.target]
                else:
                    continue
                if root_name(sources) in tainted:
                    for target in targets:
                        if isinstance(target, ast.Name) and target.id not in tainted:
                            tainted.add(target.id)
                            changed = True
        for node in ast.walk(method):
            call = node.func if isinstance(node, ast.Call) else None
            if isinstance(call, ast.Attribute) and root_name(call.value) in tainted:
                calls.add(call.attr)
            for decorator in getattr(node, "decorator_list", []):
                if ast.unparse(decorator) == "firestore.transactional":
                    calls.add("transactional")
    return calls


def rest_calls(tree: ast.Module) -> set[str]:
    """The REST methods of ``self._call(VERB, PATH, ...)`` (the TPU adapter's authorized
    session): ``queuedResources.create`` for a POST on the collection, ``.list`` for a GET on
    it, ``.get`` and ``.delete`` on one of it."""
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and self_attribute(node.func) == "_call"):
            continue
        verb = ast.literal_eval(node.args[0])
        path = node.args[1]
        text = "".join(
            str(part.value) if isinstance(part, ast.Constant) else "{}"
            for part in (path.values if isinstance(path, ast.JoinedStr) else [path])
        )
        segments = [s for s in text.split("/") if s]
        item = segments[-1] == "{}"
        collection = segments[-2] if item else segments[-1]
        method = {("POST", False): "create", ("GET", False): "list", ("GET", True): "get",
                  ("DELETE", True): "delete", ("PATCH", True): "patch"}[verb, item]  # fmt: skip
        found.add(f"{collection}.{method}")
    return found


def is_path_helper(client: type, method: str) -> bool:
    """A client's static or class method (``topic_path``, ``common_project_path``): it builds
    a resource name and calls nothing."""
    return isinstance(inspect.getattr_static(client, method), (staticmethod, classmethod))


def exporter_calls(tree: ast.Module) -> set[str]:
    """Methods OpenTelemetry's exporters that the adapters build call on their Google client
    (``self.client.create_time_series(...)`` in the exporter's source), as
    ``ClientClass.method``."""
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module):
            continue
        if not node.module.startswith("opentelemetry.exporter."):
            continue
        library = importlib.import_module(node.module)
        source = ast.parse(Path(inspect.getfile(library)).read_text())
        clients = {
            n.id
            for assign in ast.walk(source)
            if isinstance(assign, ast.Assign)
            and any(ast.unparse(t) == "self.client" for t in assign.targets)
            for n in ast.walk(assign.value)
            if isinstance(n, ast.Name) and n.id.endswith("Client")
        }
        (client,) = clients
        client_class = getattr(library, client)
        for expression in ast.walk(source):
            called = expression.func if isinstance(expression, ast.Call) else None
            if not isinstance(called, ast.Attribute) or ast.unparse(called.value) != "self.client":
                continue
            if not is_path_helper(client_class, called.attr):
                found.add(f"{client}.{called.attr}")
    return found


def type_checking_names(tree: ast.Module) -> dict[str, Any]:
    """The names a module imports only for type checking (``if TYPE_CHECKING: from
    google.cloud import secretmanager``), imported here so that annotations naming them are
    seen too."""
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING", "typing.TYPE_CHECKING"
        ):  # fmt: skip
            imports: list[ast.stmt] = [
                n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))
            ]
            exec(compile(ast.Module(body=imports, type_ignores=[]), "<imports>", "exec"), names)
    return names


def adapter_calls() -> dict[str, set[str]]:
    """Every Google call the adapters make, by kind: ``client`` (``Class.method`` of a client
    library's client), ``firestore`` (methods of Firestore's references, queries, batches and
    transactions), ``rest`` (the TPU adapter's REST methods)."""
    calls: dict[str, set[str]] = {"client": set(), "firestore": set(), "rest": set()}
    for path in sorted(ADAPTERS.glob("*.py")):
        if path.stem == "memory":  # the in-memory fakes call nothing
            continue
        tree = ast.parse(path.read_text())
        module = importlib.import_module(f"opendws.adapters.{path.stem}")
        namespace = {**type_checking_names(tree), **vars(module)}
        attributes = client_attributes(tree, namespace)
        firestore_roots = set()
        for name, (client, _) in attributes.items():
            if client.__module__.startswith("google.cloud.firestore"):
                firestore_roots.add(f"self.{name}")
        for node in ast.walk(tree):
            attribute = self_attribute(node.value) if isinstance(node, ast.Attribute) else None
            if attribute is None or attribute not in attributes:
                continue
            if f"self.{attribute}" in firestore_roots:
                continue
            assert isinstance(node, ast.Attribute)
            client = attributes[attribute][0]
            if not is_path_helper(client, node.attr):
                calls["client"].add(f"{client.__name__}.{node.attr}")
        if firestore_roots:
            calls["firestore"] |= firestore_calls(tree, firestore_roots)
        calls["rest"] |= rest_calls(tree)
        calls["client"] |= exporter_calls(tree)
    return calls


def test_the_scan_finds_the_calls_it_is_meant_to() -> None:
    """The scan sees each kind of call (a check on the scan itself)."""
    calls = adapter_calls()
    assert "InstanceGroupManagerResizeRequestsClient.insert" in calls["client"]
    assert "InstancesClient.delete" in calls["client"]  # through functools.partial
    assert "PublisherClient.publish" in calls["client"]
    assert "PublisherClient.topic_path" not in calls["client"]  # a path helper
    assert "CloudTasksClient.create_task" in calls["client"]
    assert "MetricServiceClient.create_time_series" in calls["client"]
    assert "MetricServiceClient.common_project_path" not in calls["client"]
    # A client annotated with a name imported only for type checking.
    assert "SecretManagerServiceClient.access_secret_version" in calls["client"]
    assert {"get", "stream", "commit", "transactional"} <= calls["firestore"]
    assert {"queuedResources.create", "queuedResources.delete"} <= calls["rest"]


def test_the_table_names_every_google_call_the_adapters_make() -> None:
    """Each client method an adapter calls is in the table (``Class.method``); each Firestore
    method that sends a request in a Firestore row, and none is left unclassified; each TPU
    REST method in a TPU row."""
    calls = adapter_calls()
    rows = table_rows()
    cells = " ".join(row["call"] for row in rows)
    missing = sorted(c for c in calls["client"] if f"`{c}`" not in cells)
    assert not missing, f"the table does not name {missing}"
    unknown = calls["firestore"] - FIRESTORE_REQUESTS - FIRESTORE_LOCAL - {"transactional"}
    assert not unknown, f"Firestore methods neither a request nor local: {sorted(unknown)}"
    firestore_cells = " ".join(row["call"] for row in rows if "Firestore" in row["call"])
    for method in sorted((calls["firestore"] & FIRESTORE_REQUESTS) | {"transactional"}):
        assert f"`{method}`" in firestore_cells, f"no Firestore row names {method}"
    tpu_cells = " ".join(row["call"] for row in rows if "TPU" in row["call"])
    for method in sorted(calls["rest"]):
        assert f"`{method}`" in tpu_cells, f"no TPU row names {method}"


# The build account -----------------------------------------------------------------------------


def build_accounts(root: Module) -> set[str]:
    """What each function's build_config.service_account is."""
    found = set()
    for (name,), block in root.of("module").items():
        if str(root.evaluate(block.attributes["source"])) != "./modules/function":
            continue
        function = root.module(name).resource("google_cloudfunctions2_function", "this")
        (build,) = function.attr("build_config")
        found.add(str(build.attr("service_account")))
    return found


def test_functions_are_built_as_an_account_terraform_makes_with_the_documented_roles() -> None:
    """functions/docs/securing/build-custom-sa: since July 2024 a new project's default build
    account may lack what a build needs ("new projects deploying functions for the first time
    may be using a default Cloud Build service account with insufficient permissions"), and a
    function can name its own. run/docs/configuring/services/build-service-account names the
    roles such an account needs (Logs Writer, Artifact Registry Writer, Storage Object Admin),
    as Google's example of a gen2 function with a build account grants them (magic-modules
    cloudfunctions2_basic_builder.tf.tmpl), naming it by its ``id``,
    projects/P/serviceAccounts/EMAIL: build_config.service_account is "The fully-qualified
    name of the service account to be used for building the container"."""
    root = root_with()
    assert root.var("build_service_account") is None
    accounts = root.module("identities").var("accounts")
    assert accounts["build"]["account_id"] == "opendws-build"
    assert set(accounts["build"]["project_roles"]) == BUILD_ROLES
    name = Ref('module.identities.google_service_account.account["build"].name')
    assert build_accounts(root) == {str(name)}
    # No role of the build account is granted to a function's runtime account.
    assert not {role for _, role, _ in terraform_grants(root)} & BUILD_ROLES


def test_an_existing_build_account_may_be_named_instead() -> None:
    existing = (
        "projects/my-ml-project/serviceAccounts/builder@my-ml-project.iam.gserviceaccount.com"
    )
    root = root_with(build_service_account=existing)
    assert "build" not in root.module("identities").var("accounts")
    assert build_accounts(root) == {existing}
    assert all(ok for ok, _ in root.validations("build_service_account"))


@pytest.mark.parametrize(
    "bad", ["builder@my-ml-project.iam.gserviceaccount.com", "projects/p/serviceAccounts/", "x"]
)
def test_a_build_account_not_in_the_full_name_format_is_refused(bad: str) -> None:
    root = root_with(build_service_account=bad)
    assert not all(ok for ok, _ in root.validations("build_service_account"))
