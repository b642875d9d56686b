"""What a rules review's answer grants (rbac.py), on answers shaped as the API gives them."""

from __future__ import annotations

from corral.infra.kube import rbac


def review(*rules: dict) -> dict:
    return {"kind": "SelfSubjectRulesReview", "status": {"resourceRules": list(rules), "incomplete": False}}


EDIT_ROLE = [  # a namespace Role written from docs/kubernetes.md's list, watch included
    {"verbs": ["create", "get", "list", "watch", "delete"], "apiGroups": ["batch"], "resources": ["jobs"]},
    {"verbs": ["create", "delete"], "apiGroups": [""], "resources": ["services"]},
    {"verbs": ["create", "patch", "delete", "deletecollection"], "apiGroups": [""],
     "resources": ["configmaps", "secrets"]},
    {"verbs": ["list", "watch"], "apiGroups": [""], "resources": ["pods"]},
    {"verbs": ["list"], "apiGroups": [""], "resources": ["events"]},
    {"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]},
]


def test_everything_and_the_documented_role_leave_nothing_unshown():
    assert rbac.unshown(review({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})) == []
    assert rbac.unshown(review(*EDIT_ROLE)) == []


def test_what_a_rule_does_not_grant():
    # The group must match: `jobs` in the core group is not batch's.
    assert not rbac.granted([{"verbs": ["*"], "apiGroups": [""], "resources": ["jobs"]}], "batch", "jobs", "create")
    # A subresource is named whole, or as */log; `pods` alone does not grant the log.
    assert not rbac.granted([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}], "", "pods/log", "get")
    assert rbac.granted([{"verbs": ["get"], "apiGroups": [""], "resources": ["*/log"]}], "", "pods/log", "get")
    # A rule that names objects grants nothing on the collection.
    assert not rbac.granted([{"verbs": ["*"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["x"]}],
                            "", "secrets", "create")
    assert not rbac.granted([], "", "secrets", "create")


def test_a_role_without_secrets_and_watch_is_told_what_fails_and_what_to_grant():
    rules = [r for r in EDIT_ROLE if r["resources"] != ["configmaps", "secrets"]]
    rules.append({"verbs": ["create", "patch", "delete", "deletecollection"], "apiGroups": [""],
                  "resources": ["configmaps"]})
    rules = [{**r, "verbs": [v for v in r["verbs"] if v != "watch"]} for r in rules]
    missing = rbac.unshown(review(*rules))
    assert missing == [("batch", "jobs", "watch"), ("", "secrets", "create"), ("", "secrets", "patch"),
                       ("", "secrets", "delete"), ("", "secrets", "deletecollection"), ("", "pods", "watch")]
    lines = rbac.warnings(missing, "research")
    assert lines[1] == ("your kubeconfig's user may not create, patch, delete, deletecollection secrets in namespace "
                        "research: each job there is refused; an ended job's env values (secrets included) are not "
                        "removed; grant it in the namespace's Role (docs/kubernetes.md)")
    assert len(lines) == 3 and "watch jobs" in lines[0] and "watch pods" in lines[2]


def test_an_access_review_names_the_subresource_apart():
    body = rbac.access_review("ns", "", "pods/log", "get")
    assert body["spec"]["resourceAttributes"] == {"namespace": "ns", "verb": "get", "group": "", "resource": "pods",
                                                  "subresource": "log"}
    assert rbac.allowed({"status": {"allowed": True}}) and not rbac.allowed({"status": {}})
