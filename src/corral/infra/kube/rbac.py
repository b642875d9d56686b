"""What Corral needs of a context's RBAC in its namespace, and what a review says is missing: for
`corral check`, which tells before the first job is refused.

The API's SelfSubjectRulesReview lists the rules that apply to the kubeconfig's user in a namespace,
in one request. It may be incomplete (an authorizer such as a cloud's IAM webhook cannot list its
rules), so a right it does not show is asked again exactly, one SelfSubjectAccessReview per verb,
and only what those deny is reported. Pure functions here; KubeInfra.probe makes the requests.

Cluster-wide lists of nodes and pods are not reviewed: every probe makes them, so a user without
them sees the probe fail with the API's 403.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

RULES_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@dataclass(frozen=True)
class Need:
    group: str  # "" is the core API group
    resource: str  # with its subresource: `pods/log`
    verbs: tuple[str, ...]
    why: str  # what fails without them


NEEDS = (
    Need("batch", "jobs", ("create", "get", "list", "delete"), "no job can be started, read or cancelled there"),
    Need("batch", "jobs", ("watch",), "each status query lists the jobs instead of reading the watches"),
    Need("", "services", ("create", "delete"), "a multi-node job's pods cannot find each other"),
    Need("", "configmaps", ("create", "patch", "delete", "deletecollection"),
         "each job there is refused; an ended job's files are not removed"),
    Need("", "secrets", ("create", "patch", "delete", "deletecollection"),
         "each job there is refused; an ended job's env values (secrets included) are not removed"),
    Need("", "pods", ("list",), "no job's state can be read"),
    Need("", "pods", ("watch",), "each status query lists the pods instead of reading the watches"),
    Need("", "events", ("list",), "a pending job shows no scheduler's reason"),
    Need("", "pods/log", ("get",), "`corral logs` cannot show a job's output"),
)


def rules_review(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace}}


def access_review(namespace: str, group: str, resource: str, verb: str) -> dict[str, Any]:
    name, _, sub = resource.partition("/")
    attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": name}
    if sub:
        attributes["subresource"] = sub
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}}


def _matches(values: Iterable[str], wanted: str) -> bool:
    return any(v in ("*", wanted) for v in values)


def _resource_matches(values: Iterable[str], resource: str) -> bool:
    _, _, sub = resource.partition("/")
    return any(v in ("*", resource) or (sub and v == f"*/{sub}") for v in values)


def granted(rules: Iterable[Mapping[str, Any]], group: str, resource: str, verb: str) -> bool:
    """Does a rule of a rules review grant `verb` on every object of `resource`? (A rule that names
    objects, resourceNames, grants no create, list or deletecollection, so it counts for none.)"""
    return any(not rule.get("resourceNames") and _matches(rule.get("verbs") or (), verb)
               and _matches(rule.get("apiGroups") or (), group) and _resource_matches(rule.get("resources") or (),
                                                                                       resource)
               for rule in rules)


def unshown(review: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(group, resource, verb) of every need a rules review's answer does not show granted."""
    rules = (review.get("status") or {}).get("resourceRules") or []
    return [(need.group, need.resource, verb) for need in NEEDS for verb in need.verbs
            if not granted(rules, need.group, need.resource, verb)]


def allowed(review: Mapping[str, Any]) -> bool:
    return bool((review.get("status") or {}).get("allowed"))


def warnings(denied: Iterable[tuple[str, str, str]], namespace: str) -> list[str]:
    """One line per need with denied verbs: what is missing, what fails without it, what to grant."""
    denied = set(denied)
    out = []
    for need in NEEDS:
        verbs = [v for v in need.verbs if (need.group, need.resource, v) in denied]
        if verbs:
            out.append(f"your kubeconfig's user may not {', '.join(verbs)} {need.resource} in namespace "
                       f"{namespace}: {need.why}; grant it in the namespace's Role (docs/kubernetes.md)")
    return out
