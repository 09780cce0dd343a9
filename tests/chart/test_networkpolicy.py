"""The webhook's NetworkPolicy: on by default (scanners want one per pod); ingress only to TCP 8443 of the
webhook pods, from anywhere unless `webhook.networkPolicy.from` names peers; egress never restricted
(self-managed TLS and lookups need the apiserver)."""

from __future__ import annotations

from gpu_stack_dev.chartlib import FULLNAME, find, one, render

WEBHOOK = f"{FULLNAME}-webhook"


def test_on_by_default_and_can_be_turned_off() -> None:
    assert one(render(3).objects(), "NetworkPolicy", WEBHOOK)
    assert not find(render(3, set_json={"webhook.networkPolicy.enabled": False}).objects(), "NetworkPolicy", WEBHOOK)


def test_ingress_to_8443_only_and_no_egress_rules() -> None:
    objs = render(3).objects()
    policy = one(objs, "NetworkPolicy", WEBHOOK)["spec"]
    pod_labels = one(objs, "Deployment", WEBHOOK)["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in policy["podSelector"]["matchLabels"].items())
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]


def test_peers_narrow_the_one_rule_so_only_they_reach_8443() -> None:
    """Peers and port in one rule (peer AND port): a rule of their own would let the peers reach every port,
    or leave 8443 open to anyone beside it."""
    peers = [{"ipBlock": {"cidr": "10.0.0.0/8"}}, {"namespaceSelector": {"matchLabels": {"name": "kube-system"}}}]
    objs = render(3, set_json={"webhook.networkPolicy.from": peers}).objects()
    assert one(objs, "NetworkPolicy", WEBHOOK)["spec"]["ingress"] == [
        {"ports": [{"port": 8443, "protocol": "TCP"}], "from": peers}]
