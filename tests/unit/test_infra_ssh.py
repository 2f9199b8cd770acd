"""Terraform lets IAP TCP forwarding reach the VMs' SSH port, as `dws ssh` needs: an ingress
rule allowing TCP 22 from 35.235.240.0/20 ("Create a firewall rule": "allows ingress traffic
from the IP range 35.235.240.0/20. This range contains all IP addresses that IAP uses for TCP
forwarding", https://cloud.google.com/iap/docs/using-tcp-forwarding) on every network the VMs
use — and nothing wider; infra/README.md names the roles a user needs."""

from __future__ import annotations

from tests.unit.test_infra import INFRA, blocks, resources, unquote

IAP_RANGE = "35.235.240.0/20"


def _rule() -> dict[str, object]:
    rules = [b for k, n, b in resources(INFRA / "main.tf") if k == "google_compute_firewall"]
    assert len(rules) == 1
    return rules[0]


def test_the_iap_rule_lets_in_port_22_from_iaps_range_only() -> None:
    rule = _rule()
    assert unquote(rule["direction"]) == "INGRESS"
    assert [unquote(r) for r in rule["source_ranges"]] == [IAP_RANGE]  # type: ignore[attr-defined]
    allowed = rule["allow"]
    assert isinstance(allowed, list)
    assert [(unquote(a["protocol"]), [unquote(p) for p in a["ports"]]) for a in allowed] == [
        ("tcp", ["22"])
    ]


def test_the_iap_rule_covers_every_network_the_vms_use_unless_turned_off() -> None:
    rule = _rule()
    assert rule["for_each"] == "${var.iap_ssh ? toset(local.vm_networks) : toset([])}"
    networks = "".join(str(value) for _, value in blocks(INFRA / "main.tf", "locals"))
    assert "var.vm_network" in networks
    assert "pool.network" in networks
    variables = dict(blocks(INFRA / "variables.tf", "variable"))
    assert variables["iap_ssh"]["default"] is True


def test_the_readme_names_the_roles_a_user_needs_to_ssh() -> None:
    readme = (INFRA / "README.md").read_text()
    section = readme.split("## Reaching the VMs (`dws ssh`)", 1)[1].split("\n## ", 1)[0]
    for role in ("roles/iap.tunnelResourceAccessor", "roles/compute.viewer",
                 "roles/compute.osLogin", "roles/compute.osAdminLogin"):  # fmt: skip
        assert role in section
    assert IAP_RANGE in section
