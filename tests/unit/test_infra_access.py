"""infra/ for identity-based API access (issue 19): the api's ID-token audiences, and the
optional Identity-Aware Proxy in front of it (``api_iap``, off by default), evaluated with the
HCL evaluator of tests/unit/test_infra_tenants.py for ``terraform.tfvars.example`` and chosen
overrides.

Sources: iap/docs/enabling-cloud-run (IAP on "the backend service fronting the Cloud Run
services": a load balancer whose backend is a serverless NEG; IAP on a load balancer secures
only traffic through it, not the run.app URL; to let only IAP reach the service, grant
service-PROJECT_NUMBER@gcp-sa-iap.iam.gserviceaccount.com the Cloud Run Invoker role; without
an OAuth client IAP uses the Google-managed one); iap/docs/signed-headers-howto (behind a load
balancer the header's ``aud`` is /projects/PROJECT_NUMBER/global/backendServices/SERVICE_ID);
magic-modules mmv1/products/compute/BackendService.yaml (``iap.enabled``, ``generated_id`` the
server-defined id) and products/iap/WebBackendService.yaml (IAM on
``projects/P/iap_web/compute/services/NAME``, role roles/iap.httpsResourceAccessor);
run/docs/configuring/custom-audiences (an ID token names the receiving service's URL)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from opendws.adapters.identity import GoogleIdentityVerifier
from opendws.bootstrap import Settings
from opendws.config import configuration_from_document
from opendws.ports import ADMIN_ACCESS
from tests.unit.test_identity import IapSigner
from tests.unit.test_infra_tenants import INFRA, MODULES, Module, Ref, root_with
from tests.unit.test_oidc import Signer as RsaSigner

NUMBER = "123456789012"
IAP = {"domain": "opendws.example.com", "members": ["group:ml@example.com", "domain:example.com"]}


def known(text: Any, **refs: str) -> str:
    """``text`` with the references Google fills in at apply time replaced by ``refs`` (the
    project number always)."""
    values = {"data.google_project.this.number": NUMBER, **refs}
    return re.sub(r"\$\{([^}]*)\}", lambda m: values[m[1]], str(text))


def api_environment(root: Module) -> dict[str, Any]:
    environment: dict[str, Any] = root.module("api").var("environment")
    return environment


def test_iap_is_off_by_default_and_the_api_stays_open_to_keys_and_id_tokens() -> None:
    root = root_with()
    assert root.var("api_iap") is None
    api = root.module("api")
    assert (api.var("ingress"), api.var("invokers")) == ("ALLOW_ALL", ["allUsers"])
    assert "OPENDWS_API_IAP_AUDIENCE" not in api_environment(root)
    assert root.output("api_iap") is None
    block = root.of("module")[("api_iap",)]
    assert root.evaluate(block.attributes["count"]) == 0


def test_id_tokens_may_name_either_url_of_the_api() -> None:
    """custom-audiences: a caller's token names the URL it calls: the function's
    cloudfunctions.net URL (the api_url output) or its service's deterministic run.app URL."""
    root = root_with()
    audiences = [known(url) for url in root.output("api_audiences")]
    assert audiences == [
        "https://us-central1-my-ml-project.cloudfunctions.net/opendws-api",
        f"https://opendws-api-{NUMBER}.us-central1.run.app",
    ]
    environment = {k: known(v) for k, v in api_environment(root).items() if isinstance(v, str)}
    assert Settings.from_environment(environment).api_audiences == tuple(audiences)
    # The api's verifier, with the settings Terraform gives it, takes a workload's token.
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset(audiences),
        iap_audience=None,
        google_keys=(rsa := RsaSigner()).certs,
    )
    for audience in audiences:
        token = rsa.token(aud=audience, email="trainer@p.iam.gserviceaccount.com")
        assert verifier.from_id_token(token).email == "trainer@p.iam.gserviceaccount.com"


def iap_root(**overrides: Any) -> Module:
    return root_with(api_iap={**IAP, **overrides})


def test_iap_puts_a_load_balancer_with_iap_on_its_backend_in_front_of_the_api() -> None:
    root = iap_root()
    iap = root.module("api_iap")
    neg = iap.resource("google_compute_region_network_endpoint_group", "api")
    assert neg.attr("network_endpoint_type") == "SERVERLESS"
    assert neg.attr("region") == "us-central1"
    [cloud_run] = neg.attr("cloud_run")
    assert cloud_run.attr("service") == "opendws-api"  # the function's service's name
    backend = iap.resource("google_compute_backend_service", "api")
    assert backend.attr("load_balancing_scheme") == "EXTERNAL_MANAGED"
    [iap_block] = backend.attr("iap")
    assert iap_block.attr("enabled") is True
    assert not iap_block.has("oauth2_client_id")  # the Google-managed OAuth client
    [group] = backend.attr("backend")
    assert group.attr("group") == Ref(f"{neg.path}.id")
    # A serverless NEG takes neither a health check nor a backend timeout.
    assert not backend.has("health_checks")
    assert not backend.has("timeout_sec")
    urls = iap.resource("google_compute_url_map", "api")
    assert urls.attr("default_service") == Ref(f"{backend.path}.id")
    [managed] = iap.resource("google_compute_managed_ssl_certificate", "api").attr("managed")
    assert managed.attr("domains") == ["opendws.example.com"]
    proxy = iap.resource("google_compute_target_https_proxy", "api")
    assert proxy.attr("url_map") == Ref(f"{urls.path}.id")
    rule = iap.resource("google_compute_global_forwarding_rule", "api")
    assert (rule.attr("port_range"), rule.attr("load_balancing_scheme")) == (
        "443", "EXTERNAL_MANAGED",
    )  # fmt: skip
    assert rule.attr("target") == Ref(f"{proxy.path}.id")
    assert rule.attr("ip_address") == Ref(
        "module.api_iap.google_compute_global_address.api.address"
    )


def test_the_members_given_may_pass_iap_and_no_one_else() -> None:
    iap = iap_root().module("api_iap")
    grants = iap.resource("google_iap_web_backend_service_iam_member", "accessor")
    assert isinstance(grants, dict)
    assert {key: g.attr("member") for key, g in grants.items()} == {
        member: member for member in IAP["members"]
    }
    for grant in grants.values():
        assert grant.attr("role") == "roles/iap.httpsResourceAccessor"
        assert grant.attr("web_backend_service") == "opendws-api-backend"  # the backend's name
    backend = iap.resource("google_compute_backend_service", "api")
    assert backend.attr("name") == "opendws-api-backend"


def test_the_api_checks_iaps_header_for_this_backend_service() -> None:
    """signed-headers-howto: behind a load balancer, ``aud`` is
    /projects/PROJECT_NUMBER/global/backendServices/SERVICE_ID, SERVICE_ID the backend
    service's server-defined numeric id (its ``generated_id``)."""
    root = iap_root()
    generated = "module.api_iap.google_compute_backend_service.api.generated_id"
    audience = known(api_environment(root)["OPENDWS_API_IAP_AUDIENCE"], **{generated: "4242"})
    assert audience == f"/projects/{NUMBER}/global/backendServices/4242"
    assert known(root.output("api_iap")["audience"], **{generated: "4242"}) == audience
    assert root.output("api_iap")["url"] == "https://opendws.example.com"
    settings = Settings.from_environment({"OPENDWS_API_IAP_AUDIENCE": audience})
    signer = IapSigner()
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset(), iap_audience=settings.api_iap_audience,
        iap_keys=signer.keys,
    )  # fmt: skip
    now = int(time.time())
    assertion = signer.assertion(aud=audience, iat=now, exp=now + 600)
    assert verifier.from_iap(assertion).email == "alice@example.com"


def test_by_default_iap_leaves_the_functions_own_url_open_to_keys_and_id_tokens() -> None:
    """enabling-cloud-run: IAP on a load balancer secures only the traffic through it. The
    function's URL stays public, and the api checks every call there itself."""
    api = iap_root().module("api")
    assert (api.var("ingress"), api.var("invokers")) == ("ALLOW_ALL", ["allUsers"])


def test_with_the_direct_url_closed_only_iap_reaches_the_api() -> None:
    """enabling-cloud-run: to let only IAP reach the service, the Cloud Run service takes IAM
    authentication and IAP's service agent is its invoker; ingress internal and load
    balancer."""
    api = iap_root(direct_url=False).module("api")
    assert api.var("ingress") == "ALLOW_INTERNAL_AND_GCLB"
    assert [known(member) for member in api.var("invokers")] == [
        f"serviceAccount:service-{NUMBER}@gcp-sa-iap.iam.gserviceaccount.com"
    ]


def test_iaps_api_is_enabled_and_an_apply_checks_the_service_the_neg_names() -> None:
    apis = Module(MODULES / "apis", {"project": lambda: "p"})
    assert "iap.googleapis.com" in apis.var("services")
    checks = (INFRA / "main.tf").read_text()
    check = checks.split('check "api_iap_neg_names_the_api_service"', 1)[1].split("\n}\n", 1)[0]
    assert 'reverse(split("/", module.api.service))[0] == local.names.api' in check


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ({"domain": "opendws.example.com", "members": ["user:alice@example.com"]}, []),
        ({"domain": "Not A Domain", "members": ["user:alice@example.com"]}, ["domain"]),
        ({"domain": "opendws.example.com", "members": []}, ["members"]),
        ({"domain": "opendws.example.com", "members": ["alice@example.com"]}, ["members"]),
    ],
)
def test_bad_api_iap_values_are_refused(value: dict[str, Any], refused: list[str]) -> None:
    results = root_with(api_iap=value).validations("api_iap")
    failed = [message for holds, message in results if not holds]
    assert [re.match(r"api_iap\.(\w+)", m)[1] for m in failed] == refused  # type: ignore[index]


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
def test_terraform_console_applies_the_same_api_iap_validations(tmp_path: Path) -> None:
    (tmp_path / "variables.tf").write_text((INFRA / "variables.tf").read_text())
    good = '{domain = "opendws.example.com", members = ["group:ml@example.com"]}'
    for value, ok in (
        (good, True),
        ('{domain = "x", members = ["group:ml@example.com"]}', False),
        ('{domain = "opendws.example.com", members = ["ml@example.com"]}', False),
    ):
        run = subprocess.run(
            ["terraform", "console", "-var=project=p", f"-var=api_iap={value}"],
            input="var.api_iap.direct_url\n", cwd=tmp_path, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        output = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
        assert ("Invalid value for variable" not in output) is ok, value
        if ok:
            assert run.stdout.strip().splitlines()[-1] == "true"  # direct_url's default


def test_the_readmes_access_example_is_a_valid_configuration() -> None:
    """infra/README.md shows an ``access:`` table; it loads with the example's tenants."""
    readme = (INFRA / "README.md").read_text()
    start = readme.index("```yaml\n# access") + len("```yaml\n")
    document = yaml.safe_load(readme[start : readme.index("```", start)])
    document["tenants"] = [{"name": name} for name in ("vision", "speech")]
    access = configuration_from_document(document, source="README").access
    assert {rule.tenant for rule in access} == {"vision", "speech", ADMIN_ACCESS}
    assert [rule.domain for rule in access if rule.domain] == [
        "example.com", "research.example.com", "ci-project.iam.gserviceaccount.com",
    ]  # fmt: skip
