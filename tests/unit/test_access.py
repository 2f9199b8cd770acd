"""Google identities at the API (issue 19): the configuration's access table, which tenant a
verified principal acts as, and the API answering IAP's signed header and ID tokens beside its
keys, over in-memory fakes and tokens signed here (tests/unit/test_identity.py checks the
tokens themselves).

Sources: iap/docs/signed-headers-howto (IAP adds ``x-goog-iap-jwt-assertion`` to each call it
lets through and strips the ``x-goog-*`` headers a client sends; ``email`` names the user,
``hd`` the hosted domain "if an account belongs to a hosted domain");
identity/sign-in/web/backend-auth ("to validate that the ID token represents a Google
Workspace or Cloud Identity organization account, check the hd claim"; the email's domain
alone does not); iam/docs/service-account-overview (service accounts' addresses
SA@PROJECT.iam.gserviceaccount.com, issued by Google)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from opendws.adapters.identity import GoogleIdentityVerifier
from opendws.adapters.memory import MemoryConfigStore, MemoryRequestPublisher
from opendws.bootstrap import Adapters, Container, Settings, use
from opendws.cli import main
from opendws.config import configuration_from_document, configuration_to_document
from opendws.ports import ADMIN_ACCESS, AccessRule, Configuration, Principal, TokenKind
from opendws.schema.common import ScenarioError
from opendws.service.access import (
    ACCESS_TTL,
    IAP_HEADER,
    MISS_RELOAD,
    GoogleAccess,
    looks_like_jwt,
    rule_for,
)
from opendws.service.api import ADMIN, ApiService, key_digest
from opendws.service.queries import QueryService
from opendws.service.usage import UsageService
from tests.builders import A3, H100, MINUTE, NOW, flex, pool
from tests.unit.test_identity import IAP_AUDIENCE, IapSigner, id_token
from tests.unit.test_oidc import Signer as RsaSigner
from tests.world import World, memory_world, submit, tenants_for

API_URL = "https://opendws-api-123456789012.us-central1.run.app"
ZONE = "us-central1-a"
ACCESS = (
    AccessRule(principal="alice@example.com", tenant="vision"),
    AccessRule(principal="domain:example.com", tenant="speech"),
    AccessRule(principal="ops@example.com", tenant=ADMIN_ACCESS),
    AccessRule(principal="trainer@p.iam.gserviceaccount.com", tenant="vision"),
    AccessRule(principal="domain:ci-project.iam.gserviceaccount.com", tenant="speech"),
)


def principal(email: str, hd: str | None = None) -> Principal:
    return Principal(email, hd, TokenKind.ID_TOKEN)


# The access table in the configuration -------------------------------------------------------


def configuration(*access: dict[str, Any]) -> Configuration:
    document = {"tenants": [{"name": "vision"}, {"name": "speech"}], "access": list(access)}
    return configuration_from_document(document, source="config.yaml")


def test_the_table_takes_emails_and_domains_in_either_spelling_and_round_trips() -> None:
    loaded = configuration(
        {"principal": "Alice@Example.com", "tenant": "vision"},
        {"principal": "*@example.com", "tenant": "speech"},
        {"principal": "domain:Corp.Example.com", "tenant": "admin"},
    )
    assert loaded.access == (
        AccessRule(principal="alice@example.com", tenant="vision"),
        AccessRule(principal="domain:example.com", tenant="speech"),
        AccessRule(principal="domain:corp.example.com", tenant=ADMIN_ACCESS),
    )
    assert [rule.domain for rule in loaded.access] == [None, "example.com", "corp.example.com"]
    again = configuration_from_document(configuration_to_document(loaded), source="Firestore")
    assert again.access == loaded.access


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"principal": "alice", "tenant": "vision"},
         r"access\[0\] \(alice\): principal: 'alice' is not an email \(alice@example.com\) or "
         r"a domain \(\*@example.com or domain:example.com\)"),
        ({"principal": "*@localhost", "tenant": "vision"},
         r"'localhost' is not a domain name such as example.com"),
        ({"principal": "domain:", "tenant": "vision"}, r"'' is not a domain name"),
        ({"principal": "a*b@example.com", "tenant": "vision"}, r"is not an email"),
        ({"principal": "group:ml@example.com", "tenant": "vision"},
         r"groups cannot be matched: neither IAP's signed header nor an ID token says"),
        ({"principal": "user:alice@example.com", "tenant": "vision"},
         r"give the email alone, without the IAM prefix 'user'"),
        ({"principal": "alice@example.com", "tenant": "audio"},
         r"access\[0\] \(alice@example.com\): tenant: 'audio' is no configured tenant "
         r"\(known: speech, vision, admin\)"),
        ({"principal": "alice@example.com"}, r"access\[0\].*tenant"),
        ({"principal": "alice@example.com", "tenant": "vision", "role": "admin"},
         r"unknown field 'role'"),
    ],
)  # fmt: skip
def test_a_bad_entry_is_refused_naming_it_and_what_to_fix(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScenarioError, match=message):
        configuration(entry)


def test_a_principal_named_twice_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"access\[1\] \(domain:example.com\): principal: "
                       r"access\[0\] names it already"):  # fmt: skip
        configuration({"principal": "*@example.com", "tenant": "vision"},
                      {"principal": "domain:EXAMPLE.com", "tenant": "speech"})  # fmt: skip


# Which rule a principal falls under -----------------------------------------------------------


def test_an_email_rule_names_its_account_and_wins_over_its_domains_rule() -> None:
    assert rule_for(principal("alice@example.com", "example.com"), ACCESS) == ACCESS[0]
    assert rule_for(principal("ALICE@example.com"), ACCESS) == ACCESS[0]
    assert rule_for(principal("ops@example.com", "example.com"), ACCESS) == ACCESS[2]


def test_a_domain_rule_admits_the_accounts_that_domain_manages() -> None:
    """backend-auth: the ``hd`` claim says a Workspace or Cloud Identity domain manages the
    account; a consumer account with an address at that domain carries none."""
    assert rule_for(principal("bob@example.com", "example.com"), ACCESS) == ACCESS[1]
    assert rule_for(principal("bob@example.com"), ACCESS) is None
    # hd names the domain, not a parent of it: a sub-domain's accounts are not example.com's.
    assert rule_for(principal("eve@sub.example.com", "sub.example.com"), ACCESS) is None
    assert rule_for(principal("eve@example.org", "example.org"), ACCESS) is None


def test_a_service_account_domain_rule_admits_that_projects_service_accounts() -> None:
    """Service accounts carry no hd, and only Google issues addresses at
    gserviceaccount.com: such a domain rule matches on the email's domain."""
    ci = principal("runner@ci-project.iam.gserviceaccount.com")
    assert rule_for(ci, ACCESS) == ACCESS[4]
    assert rule_for(principal("runner@other.iam.gserviceaccount.com"), ACCESS) is None
    assert rule_for(principal("trainer@p.iam.gserviceaccount.com"), ACCESS) == ACCESS[3]


def test_an_admin_rule_and_the_admin_key_name_the_admins_alike() -> None:
    assert ADMIN_ACCESS == ADMIN


def test_a_key_is_never_taken_for_a_jwt() -> None:
    """Terraform's keys are 40 letters and digits (random_password, special = false)."""
    signer = RsaSigner()
    assert looks_like_jwt(signer.token())
    assert looks_like_jwt(IapSigner().assertion())
    for key in ("k-vision", "a" * 40, "abc.def.ghi", "eyJhbGciOiJIUzI1NiJ9..sig", "", "a.b.c.d"):
        assert not looks_like_jwt(key), key


# The API with Google identities ---------------------------------------------------------------


KEYS = {key_digest("k-vision"): "vision"}


class Api:
    """An ApiService over a memory world, taking keys, IAP's header and ID tokens."""

    def __init__(self, *, google: bool = True) -> None:
        self.iap, self.accounts = IapSigner(), RsaSigner()
        tenants = tenants_for(H100, names=("vision", "speech"))
        self.config = Configuration(pools=(pool(zone=ZONE, capacity=4),), tenants=tenants,
                                    access=ACCESS)  # fmt: skip
        world, cloud = memory_world((), (), timers=True, configuration=self.config)
        cloud.set_stock(ZONE, A3, 4)
        submit(world.store, flex("mine", tenant="vision", vm_count=4, hours=2))
        submit(world.store, flex("theirs", tenant="speech", vm_count=4, hours=3,
                                 submitted_at=NOW + MINUTE))  # fmt: skip
        world.run()
        self.world: World = world
        verifier = GoogleIdentityVerifier(
            id_token_audiences=frozenset({API_URL}), iap_audience=IAP_AUDIENCE,
            iap_keys=self.iap.keys, google_keys=self.accounts.certs,
        )  # fmt: skip
        self.access = GoogleAccess(verifier, world.config, world.clock) if google else None
        self.service = ApiService(
            world.store, QueryService(world.store, world.store, world.config),
            UsageService(world.store), world.ending, world.clock, KEYS, google=self.access,
        )  # fmt: skip

    def get(self, path: str, headers: dict[str, str]) -> tuple[int, Any]:
        answer = self.service.handle("GET", path, headers)
        return answer.status, answer.body

    def through_iap(self, email: str, hd: str | None = None, **claims: Any) -> dict[str, str]:
        return {IAP_HEADER: self.iap.assertion(email=email, hd=hd, **claims)}

    def bearer(self, email: str, **claims: Any) -> dict[str, str]:
        return {"Authorization": f"Bearer {id_token(self.accounts, email=email, **claims)}"}


@pytest.fixture
def api() -> Api:
    return Api()


def request_ids(body: Any) -> list[str]:
    return [entry["request_id"] for entry in body]


def test_a_user_through_iap_acts_as_the_tenant_the_table_names(api: Api) -> None:
    assert api.get("/requests/mine", api.through_iap("alice@example.com"))[0] == 200
    assert api.get("/requests/theirs", api.through_iap("alice@example.com"))[0] == 404
    # Bob is in no email rule; his Workspace domain's rule makes him speech.
    status, body = api.get("/queue", api.through_iap("bob@example.com", hd="example.com"))
    assert (status, request_ids(body)) == (200, ["theirs"])
    # An admin sees every tenant's requests.
    assert request_ids(api.get("/queue", api.through_iap("ops@example.com"))[1]) == ["theirs"]
    assert api.get("/requests/mine", api.through_iap("ops@example.com"))[0] == 200


def test_a_workloads_id_token_acts_as_its_service_accounts_tenant(api: Api) -> None:
    assert api.get("/requests/mine", api.bearer("trainer@p.iam.gserviceaccount.com"))[0] == 200
    runner = api.bearer("runner@ci-project.iam.gserviceaccount.com")
    assert api.get("/requests/theirs", runner)[0] == 200
    assert api.get("/requests/mine", runner)[0] == 404


def test_keys_keep_working_beside_google_identities(api: Api) -> None:
    assert api.get("/requests/mine", {"Authorization": "Bearer k-vision"})[0] == 200
    status, body = api.get("/queue", {"Authorization": "Bearer k-unknown"})
    assert (status, body) == (
        401, {"error": "this API key is not known: give Authorization: Bearer <your API key>"},
    )  # fmt: skip
    # No key at all is told what to give, not that a key is unknown.
    assert api.get("/queue", {}) == (401, {"error": "give Authorization: Bearer <your API key>"})


def test_an_unknown_principal_is_forbidden_saying_what_to_add(api: Api) -> None:
    status, body = api.get("/queue", api.through_iap("mallory@example.org", hd="example.org"))
    assert status == 403
    assert body["error"] == (
        "mallory@example.org (verified from the IAP signed header) is in no rule of the "
        "configuration's access table; an admin adds one (access: principal, tenant) with "
        "dws config apply"
    )
    status, body = api.get("/queue", api.bearer("stranger@q.iam.gserviceaccount.com"))
    assert status == 403
    assert "stranger@q.iam.gserviceaccount.com (verified from the Google ID token)" in body["error"]


def test_a_consumer_account_at_a_listed_domain_is_told_why_it_is_not_admitted(api: Api) -> None:
    status, body = api.get("/queue", api.through_iap("carol@example.com"))
    assert status == 403
    assert "the rule for domain:example.com admits accounts that domain manages" in body["error"]
    assert "this token carries no hd" in body["error"]


def test_refusals_say_which_check_failed(api: Api) -> None:
    now = int(time.time())
    cases = [
        (api.through_iap("alice@example.com", iat=now - 700, exp=now - 60), 401,
         "clock skew of 30 s: Token expired"),
        (api.through_iap("alice@example.com", iss="https://accounts.google.com"), 401,
         "IAP header issuer 'https://accounts.google.com' is not"),
        (api.through_iap("alice@example.com", aud="/projects/1/global/backendServices/2"), 403,
         "IAP header is for audience '/projects/1/global/backendServices/2'"),
        ({IAP_HEADER: IapSigner().assertion()}, 401, "Could not verify token signature"),
        (api.bearer("alice@example.com", aud="https://elsewhere.example"), 403,
         "ID token is for audience 'https://elsewhere.example', not this API's"),
        (api.bearer("alice@example.com", email_verified=False), 403, "is not verified"),
        (api.bearer("alice@example.com", iss="https://evil.example"), 401,
         "ID token issuer 'https://evil.example' is not accepted"),
    ]  # fmt: skip
    for headers, status, message in cases:
        answer = api.get("/queue", headers)
        assert answer[0] == status, message
        assert message in answer[1]["error"]
        token = next(iter(headers.values())).removeprefix("Bearer ")
        assert token not in answer[1]["error"]  # never echoed


def test_iaps_header_names_the_caller_whatever_else_the_call_carries(api: Api) -> None:
    """IAP adds its header to each call it lets through (and strips a client's own): behind
    IAP the header, not the Authorization the caller sent to IAP, says who calls."""
    headers = {**api.through_iap("bob@example.com", hd="example.com"),
               "Authorization": "Bearer k-vision"}  # fmt: skip
    assert api.get("/requests/theirs", headers)[0] == 200  # speech, as Bob
    assert api.get("/requests/mine", headers)[0] == 404
    forged = {IAP_HEADER: "forged", "Authorization": "Bearer k-vision"}
    assert api.get("/requests/mine", forged)[0] == 401  # a bad header is not passed over


def test_without_google_identities_configured_tokens_get_a_clear_401() -> None:
    api = Api(google=False)
    for headers in (api.through_iap("alice@example.com"), api.bearer("alice@example.com")):
        assert api.get("/queue", headers) == (
            401, {"error": "this API takes API keys only (no Google identity is configured "
                           "for it)"},
        )  # fmt: skip
    assert api.get("/requests/mine", {"Authorization": "Bearer k-vision"})[0] == 200


def test_a_rule_just_applied_holds_within_seconds_and_the_table_is_not_read_per_call(
    api: Api,
) -> None:
    reads = CountingConfig(api.world.config)
    access = GoogleAccess(api.access._verifier, reads, api.world.clock)  # type: ignore[union-attr]
    dave = api.iap.assertion(email="dave@example.org", hd=None)
    for _ in range(5):
        assert access.tenant(assertion=api.iap.assertion(), token=None) == "vision"
    assert reads.loads == 1
    api.world.config.save(Configuration(
        tenants=api.config.tenants,
        access=(*ACCESS, AccessRule(principal="dave@example.org", tenant="speech")),
    ))  # fmt: skip
    with pytest.raises(PermissionError, match="in no rule"):
        access.tenant(assertion=dave, token=None)  # kept less than MISS_RELOAD ago
    api.world.clock.advance(MISS_RELOAD)
    assert access.tenant(assertion=dave, token=None) == "speech"
    assert reads.loads == 2
    api.world.clock.advance(ACCESS_TTL)
    access.tenant(assertion=api.iap.assertion(), token=None)
    assert reads.loads == 3
    assert timedelta(seconds=5) == MISS_RELOAD
    assert timedelta(seconds=30) == ACCESS_TTL


class CountingConfig(MemoryConfigStore):
    def __init__(self, inner: Any) -> None:
        super().__init__()
        self._inner = inner
        self.loads = 0

    def load(self) -> Configuration:
        self.loads += 1
        loaded: Configuration = self._inner.load()
        return loaded


def memory_adapters(world: World) -> Adapters:
    return Adapters(
        store=world.store, config=world.config, events=world.bus, nudger=world.nudger,
        publisher=MemoryRequestPublisher(), clock=world.clock,
    )  # fmt: skip


def test_dws_config_apply_takes_the_table_and_refuses_a_bad_entry(tmp_path: Path) -> None:
    world, _ = memory_world((), ())
    previous = use(Container(Settings(project="p"), adapters=memory_adapters(world)))
    try:
        good = tmp_path / "config.yaml"
        good.write_text(
            "tenants: [{name: vision}]\n"
            "access:\n"
            "  - {principal: alice@example.com, tenant: vision}\n"
            "  - {principal: '*@example.com', tenant: admin}\n"
        )
        applied = CliRunner().invoke(main, ["config", "apply", str(good)])
        assert applied.exit_code == 0, applied.output
        assert "1 tenants, 0 prices, 2 access rules" in applied.output
        assert world.config.load().access == (
            AccessRule(principal="alice@example.com", tenant="vision"),
            AccessRule(principal="domain:example.com", tenant=ADMIN_ACCESS),
        )
        bad = tmp_path / "bad.yaml"
        bad.write_text("tenants: [{name: vision}]\naccess: [{principal: vision, tenant: vision}]\n")
        refused = CliRunner().invoke(main, ["config", "apply", str(bad)])
        assert refused.exit_code == 2
        assert f"{bad}: access[0] (vision): principal: 'vision' is not an email" in refused.output
        assert len(world.config.load().access) == 2  # unchanged
    finally:
        use(previous)


def test_the_container_gives_the_api_google_identities_only_with_an_audience() -> None:
    world, _ = memory_world((), ())
    adapters = memory_adapters(world)
    plain = Container(Settings(project="p"), adapters=adapters).api
    assert plain._google is None
    settings = Settings(project="p", api_audiences=(API_URL,), api_iap_audience=IAP_AUDIENCE)
    container = Container(settings, adapters=adapters)
    google = container.api._google
    assert isinstance(google, GoogleAccess)
    verifier = container.principals
    assert isinstance(verifier, GoogleIdentityVerifier)
    assert (verifier._audiences, verifier._iap_audience) == (frozenset({API_URL}), IAP_AUDIENCE)
    assert google._config is world.config
