//! Who may do what, tried with the real `kubectl` as each user: a node's certificate (as a join
//! gives one) reaches only its own objects, a user with no binding nothing, and RBAC bindings
//! grant and take away access as soon as they are written.

mod common;

use base64::Engine;
use common::{Server, text};
use std::path::PathBuf;

const OBJECTS: &str = include_str!("manifests/objects.yaml");

/// A kubeconfig of `server` for a client certificate the API's CA signs for `name` in
/// `group` (a node's is what cloudhub signs at a join: `system:node:NAME` in `system:nodes`).
fn kubeconfig_for(s: &Server, name: &str, group: Option<&str>) -> PathBuf {
    let pki = s.data().join("pki");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).expect("CA file");
    let (cert, key) = pki::sign_leaf(&read("ca.crt"), &read("ca.key"), name, group, &[], false, 1)
        .expect("a client certificate");
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    let file = s.dir.join(format!("{}.kubeconfig", name.replace(':', "-")));
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: default}}\ncurrent-context: c\n",
            s.port,
            b64(&read("ca.crt")),
            b64(&cert),
            b64(&key)
        ),
    )
    .expect("kubeconfig written");
    file
}

/// kubectl as the user of `kubeconfig`: (success, stdout and stderr).
fn as_user(s: &Server, kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--kubeconfig", kubeconfig.to_str().expect("utf-8")];
    all.extend_from_slice(args);
    let out = std::process::Command::new(common::kubectl_bin())
        .args(&all)
        .arg("--cache-dir")
        .arg(s.dir.join("kube-cache"))
        .env("HOME", &s.dir)
        .output()
        .expect("kubectl runs");
    (out.status.success(), text(&out))
}

#[test]
fn a_nodes_certificate_reaches_only_its_own_objects() {
    let s = Server::start();
    let out = s.kubectl_stdin(&["apply", "-f", "-"], OBJECTS);
    assert!(out.status.success(), "{}", text(&out));
    let node = kubeconfig_for(&s, "system:node:n1", Some("system:nodes"));
    let may = |args: &[&str]| {
        let (ok, out) = as_user(&s, &node, args);
        assert!(ok, "as n1, {args:?} should pass: {out}");
        out
    };
    let may_not = |args: &[&str], message: &str| {
        let (ok, out) = as_user(&s, &node, args);
        assert!(!ok, "as n1, {args:?} should be forbidden: {out}");
        assert!(
            out.contains(&format!("Error from server (Forbidden): {message}")),
            "{args:?}: {out}"
        );
    };
    // Its pod, the Secret and ConfigMap that pod names, its device and that device's model.
    assert!(may(&["get", "pod", "p1", "-o", "name"]).contains("pod/p1"));
    assert!(may(&["get", "secret", "s1", "-o", "jsonpath={.data.password}"]).contains("b25l"));
    may(&["get", "configmap", "cm1"]);
    let mine = may(&[
        "get",
        "pods",
        "--field-selector",
        "spec.nodeName=n1",
        "-o",
        "name",
    ]);
    assert_eq!(mine.trim(), "pod/p1");
    may(&["get", "device", "d1"]);
    may(&["get", "devicemodel", "m1"]);
    // Selectors crafted so that a second reading of their text would pin them to n1 while the
    // list served everything (the hole of 2026-11-27): refused, as kube-apiserver's grammar
    // has no parentheses, or answered with n1's own only.
    for crafted in [
        "spec.nodeName!=(,spec.nodeName=n1,)",
        "spec.nodeName!=(spec.nodeName=n1,spec.nodeName=n1 ",
    ] {
        for verb in [
            &["get", "pods", "-A"][..],
            &["get", "pods", "-A", "--watch"],
        ] {
            let mut args = verb.to_vec();
            args.extend([
                "--field-selector",
                crafted,
                "-o",
                "name",
                "--request-timeout=5s",
            ]);
            let (ok, out) = as_user(&s, &node, &args);
            assert!(!ok && !out.contains("p2"), "{args:?}: {out}");
            assert!(
                out.contains("(BadRequest)") || out.contains("(Forbidden)"),
                "{args:?}: {out}"
            );
        }
    }
    for crafted in [
        "metadata.name!=(,metadata.name=s1,)",
        "metadata.name=s1,metadata.name=s2",
    ] {
        let (_, out) = as_user(&s, &node, &["get", "secrets", "--field-selector", crafted]);
        assert!(!out.contains("s2"), "{crafted}: {out}");
    }
    // Another node's, and anything listed wholesale.
    may_not(
        &["get", "secret", "s2"],
        "secrets \"s2\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\"",
    );
    may_not(
        &["get", "secrets", "-A"],
        "secrets is forbidden: User \"system:node:n1\" cannot list resource \"secrets\" in API group \"\" at the cluster scope",
    );
    may_not(
        &["get", "pod", "p2"],
        "pods \"p2\" is forbidden: User \"system:node:n1\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\"",
    );
    may_not(
        &["get", "device", "d2"],
        "devices.devices.kubeedge.io \"d2\" is forbidden: User \"system:node:n1\" cannot get resource \"devices\" in API group \"devices.kubeedge.io\" in the namespace \"default\"",
    );
    may_not(
        &["get", "devicemodel", "m2"],
        "devicemodels.devices.kubeedge.io \"m2\" is forbidden",
    );
    may_not(
        &["delete", "device", "d1"],
        "devices.devices.kubeedge.io \"d1\" is forbidden",
    );
    let (ok, out) = as_user(
        &s,
        &node,
        &[
            "run",
            "x",
            "--image=x:1",
            "-n",
            "kube-system",
            "--overrides",
            r#"{"spec":{"nodeName":"n2"}}"#,
        ],
    );
    assert!(!ok && out.contains("pods is forbidden"), "{out}");
    // Its own Node and Lease it may create (NodeRestriction: the name in the body), no other.
    let manifest = |kind: &str, name: &str| {
        let file = s.dir.join(format!("{kind}-{name}.yaml"));
        let text = match kind {
            "Node" => format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"),
            _ => format!(
                "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: {name}, namespace: kube-node-lease}}\nspec: {{holderIdentity: {name}}}\n"
            ),
        };
        std::fs::write(&file, text).expect("manifest");
        file
    };
    for kind in ["Node", "Lease"] {
        let own = manifest(kind, "n1");
        may(&["create", "-f", own.to_str().expect("utf-8")]);
        let other = manifest(kind, "n2");
        let (ok, out) = as_user(&s, &node, &["create", "-f", other.to_str().expect("utf-8")]);
        assert!(!ok && out.contains("is forbidden"), "{kind} n2: {out}");
    }
    // What it asks about itself, as kubectl asks.
    assert_eq!(may(&["auth", "can-i", "get", "secret/s1"]).trim(), "yes");
    let (ok, out) = as_user(&s, &node, &["auth", "can-i", "list", "secrets"]);
    assert!(!ok && out.trim_start().starts_with("no"), "{out}");
    let list = may(&["auth", "can-i", "--list"]);
    assert!(list.contains("nodes") && list.contains("[n1]"), "{list}");
    // Nothing was changed by its attempts.
    assert!(
        s.ok(&["get", "device", "d1", "-o", "name"])
            .contains("device")
    );
    assert!(!s.ok(&["get", "pods", "-A"]).contains("kube-system"));
}

#[test]
fn rbac_bindings_grant_and_take_away_access_at_once() {
    let s = Server::start();
    let out = s.kubectl_stdin(&["apply", "-f", "-"], OBJECTS);
    assert!(out.status.success(), "{}", text(&out));
    let alice = kubeconfig_for(&s, "alice", Some("devs"));
    let (ok, out) = as_user(&s, &alice, &["get", "devices"]);
    assert!(
        !ok && out.contains("devices.devices.kubeedge.io is forbidden: User \"alice\" cannot list resource \"devices\" in API group \"devices.kubeedge.io\" in the namespace \"default\""),
        "no binding, no access: {out}"
    );
    // The bootstrap ClusterRoles are there; `view` given to her group in one namespace.
    let roles = s.ok(&["get", "clusterroles", "-o", "name"]);
    for r in ["cluster-admin", "admin", "edit", "view"] {
        assert!(
            roles.contains(&format!("clusterrole.rbac.authorization.k8s.io/{r}")),
            "{roles}"
        );
    }
    s.ok(&[
        "create",
        "rolebinding",
        "devs-view",
        "--clusterrole=view",
        "--group=devs",
        "-n",
        "default",
    ]);
    let (ok, out) = as_user(&s, &alice, &["get", "devices", "-o", "name"]);
    assert!(ok && out.contains("device.devices.kubeedge.io/d1"), "{out}");
    let (ok, out) = as_user(&s, &alice, &["get", "secrets"]);
    assert!(
        !ok && out.contains("secrets is forbidden"),
        "view does not read Secrets: {out}"
    );
    let (ok, out) = as_user(&s, &alice, &["delete", "device", "d1"]);
    assert!(!ok && out.contains("cannot delete resource"), "{out}");
    let (ok, out) = as_user(&s, &alice, &["get", "devices", "-n", "kube-system"]);
    assert!(
        !ok && out.contains("in the namespace \"kube-system\""),
        "only where bound: {out}"
    );
    let (ok, list) = as_user(&s, &alice, &["auth", "can-i", "--list"]);
    assert!(
        ok && list.contains("devices.devices.kubeedge.io") && list.contains("[get list watch]"),
        "{list}"
    );
    // Impersonation: the admin may act as her; she may not act as anyone.
    let (ok, out) = as_user(
        &s,
        &s.kubeconfig,
        &["get", "secrets", "--as", "alice", "--as-group", "devs"],
    );
    assert!(
        !ok && out.contains("User \"alice\" cannot list resource \"secrets\""),
        "{out}"
    );
    let (ok, out) = as_user(&s, &alice, &["get", "secrets", "--as", "admin"]);
    assert!(
        !ok && out.contains("cannot impersonate resource \"users\""),
        "{out}"
    );
    // A Role of her own namespace, then the binding goes: so does the access.
    s.ok(&[
        "create",
        "role",
        "secret-reader",
        "--verb=get",
        "--resource=secrets",
        "--resource-name=s2",
    ]);
    s.ok(&[
        "create",
        "rolebinding",
        "alice-secret",
        "--role=secret-reader",
        "--user=alice",
    ]);
    let (ok, out) = as_user(&s, &alice, &["get", "secret", "s2", "-o", "name"]);
    assert!(ok, "{out}");
    let (ok, _) = as_user(&s, &alice, &["get", "secret", "s1"]);
    assert!(!ok, "resourceNames limit the rule");
    s.ok(&["delete", "rolebinding", "devs-view", "alice-secret"]);
    let (ok, out) = as_user(&s, &alice, &["get", "devices"]);
    assert!(!ok && out.contains("forbidden"), "{out}");
}

/// NodeRestriction's label rules, with kubectl as the node: its own labels and the kubelet's
/// yes, `node-restriction.kubernetes.io/` and `node-role` no, neither at a create nor after.
#[test]
fn a_node_sets_only_the_labels_a_kubelet_may_set_on_its_own_node() {
    let s = Server::start();
    let node = kubeconfig_for(&s, "system:node:n1", Some("system:nodes"));
    let file = s.dir.join("n1.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  labels: {node-restriction.kubernetes.io/site: b}\n",
    )
    .expect("manifest");
    let (ok, out) = as_user(&s, &node, &["create", "-f", file.to_str().expect("utf-8")]);
    assert!(
        !ok && out.contains("Error from server (Forbidden): error when creating") && out.contains(
            "nodes \"n1\" is forbidden: is not allowed to set the following labels: node-restriction.kubernetes.io/site"
        ),
        "{out}"
    );
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  labels: {kubernetes.io/hostname: n1}\n",
    )
    .expect("manifest");
    let (ok, out) = as_user(&s, &node, &["create", "-f", file.to_str().expect("utf-8")]);
    assert!(ok, "{out}");
    s.ok(&[
        "label",
        "node",
        "n1",
        "node-restriction.kubernetes.io/site=a",
    ]);
    for (label, ok_wanted) in [
        ("site=plant-3", true),
        ("kubernetes.io/arch=amd64", true),
        ("node.kubernetes.io/instance-type=gw", true),
        ("node-restriction.kubernetes.io/site=b", false),
        ("node-restriction.kubernetes.io/site-", false),
        ("node-role.kubernetes.io/control-plane=", false),
        ("x.k8s.io/y=1", false),
    ] {
        let (ok, out) = as_user(&s, &node, &["label", "node", "n1", label, "--overwrite"]);
        assert_eq!(ok, ok_wanted, "{label}: {out}");
        if !ok_wanted {
            let key = label.split(['=', '-']).next().unwrap_or_default();
            assert!(
                out.contains("Error from server (Forbidden): nodes \"n1\" is forbidden: is not allowed to modify labels: ")
                    && out.contains(key),
                "{label}: {out}"
            );
        }
    }
    let labels = s.ok(&["get", "node", "n1", "-o", "jsonpath={.metadata.labels}"]);
    assert!(
        labels.contains("\"node-restriction.kubernetes.io/site\":\"a\"")
            && labels.contains("plant-3"),
        "{labels}"
    );
    assert!(!labels.contains("control-plane"), "{labels}");
}

/// kubectl's arguments for a Role that grants everything in the namespace `plant`.
const STAR_ROLE: &[&str] = &[
    "create",
    "role",
    "star",
    "-n",
    "plant",
    "--verb=*",
    "--resource=*.*",
];

/// RBAC's escalation check, as Kubernetes' own tests make it: a user who may only create
/// bindings cannot bind cluster-admin; a namespace admin cannot bind cluster-admin or make a
/// `*` Role there, yet binds `edit` and makes Roles it holds; `bind` and `escalate` lift it.
#[test]
fn roles_and_bindings_grant_no_more_than_their_author_holds() {
    let s = Server::start();
    s.ok(&["create", "namespace", "plant"]);
    s.ok(&[
        "create",
        "clusterrole",
        "binder",
        "--verb=create,get,list",
        "--resource=clusterrolebindings,rolebindings",
    ]);
    s.ok(&[
        "create",
        "clusterrolebinding",
        "alice-binder",
        "--clusterrole=binder",
        "--user=alice",
    ]);
    s.ok(&[
        "create",
        "rolebinding",
        "bob-admin",
        "-n",
        "plant",
        "--clusterrole=admin",
        "--user=bob",
    ]);
    let alice = kubeconfig_for(&s, "alice", None);
    let bob = kubeconfig_for(&s, "bob", None);
    let refused = |who: &std::path::Path, args: &[&str], what: &str| {
        let (ok, out) = as_user(&s, who, args);
        assert!(!ok, "{args:?} should be refused: {out}");
        assert!(
            out.contains(&format!("{what} is forbidden: user \""))
                && out.contains("is attempting to grant RBAC permissions not currently held:"),
            "{args:?}: {out}"
        );
        out
    };
    let out = refused(
        &alice,
        &[
            "create",
            "clusterrolebinding",
            "pwn",
            "--clusterrole=cluster-admin",
            "--user=alice",
        ],
        "clusterrolebindings.rbac.authorization.k8s.io \"pwn\"",
    );
    assert!(
        out.contains(r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#),
        "{out}"
    );
    refused(
        &bob,
        &[
            "create",
            "rolebinding",
            "pwn",
            "-n",
            "plant",
            "--clusterrole=cluster-admin",
            "--user=bob",
        ],
        "rolebindings.rbac.authorization.k8s.io \"pwn\"",
    );
    refused(&bob, STAR_ROLE, "roles.rbac.authorization.k8s.io \"star\"");
    let may = |who: &std::path::Path, args: &[&str]| {
        let (ok, out) = as_user(&s, who, args);
        assert!(ok, "{args:?}: {out}");
    };
    may(
        &bob,
        &[
            "create",
            "role",
            "reader",
            "-n",
            "plant",
            "--verb=get",
            "--resource=pods",
        ],
    );
    may(
        &bob,
        &[
            "create",
            "rolebinding",
            "carol-edit",
            "-n",
            "plant",
            "--clusterrole=edit",
            "--user=carol",
        ],
    );
    // The refusals left nothing behind.
    let bindings = s.ok(&[
        "get",
        "clusterrolebindings,rolebindings",
        "-A",
        "-o",
        "name",
    ]);
    assert!(!bindings.contains("pwn"), "{bindings}");
    // `bind` on one role lifts the check for that role only; `escalate` for Roles.
    s.ok(&[
        "create",
        "clusterrole",
        "bind-view",
        "--verb=bind",
        "--resource=clusterroles",
        "--resource-name=view",
    ]);
    s.ok(&[
        "create",
        "clusterrolebinding",
        "alice-bind-view",
        "--clusterrole=bind-view",
        "--user=alice",
    ]);
    may(
        &alice,
        &[
            "create",
            "clusterrolebinding",
            "dave-view",
            "--clusterrole=view",
            "--user=dave",
        ],
    );
    refused(
        &alice,
        &[
            "create",
            "clusterrolebinding",
            "dave-admin",
            "--clusterrole=admin",
            "--user=dave",
        ],
        "clusterrolebindings.rbac.authorization.k8s.io \"dave-admin\"",
    );
    s.ok(&[
        "create",
        "role",
        "escalator",
        "-n",
        "plant",
        "--verb=escalate",
        "--resource=roles",
    ]);
    s.ok(&[
        "create",
        "rolebinding",
        "bob-escalate",
        "-n",
        "plant",
        "--role=escalator",
        "--user=bob",
    ]);
    may(&bob, STAR_ROLE);
}

/// The pod that took a gateway's root: `hostPath: /`, `hostNetwork`, `hostPID`, `privileged`,
/// `nodeName` a gateway.
const ROOT_POD: &str = include_str!("manifests/root_pod.yaml");

/// Pod Security admission as kube-apiserver applies the namespace labels, with kubectl as a
/// namespace's `edit` user: `restricted` and `baseline` refuse the root pod naming each check,
/// `warn` stores it with kubectl printing the warning, an unlabelled namespace is `privileged`
/// (kube-apiserver's default); a restricted pod passes `restricted`.
#[test]
fn pod_security_levels_refuse_a_pod_that_takes_the_gateway() {
    let s = Server::start();
    for (ns, labels) in [
        ("plant-a", "pod-security.kubernetes.io/enforce=restricted"),
        ("plant-b", "pod-security.kubernetes.io/enforce=baseline"),
        ("plant-c", "pod-security.kubernetes.io/warn=baseline"),
        ("plant-d", ""),
    ] {
        s.ok(&["create", "namespace", ns]);
        if !labels.is_empty() {
            s.ok(&["label", "namespace", ns, labels]);
        }
        s.ok(&[
            "create",
            "rolebinding",
            "bob-edit",
            "--clusterrole=edit",
            "--user=bob",
            "-n",
            ns,
        ]);
    }
    let bob = kubeconfig_for(&s, "bob", None);
    let create = |ns: &str, pod: &str| {
        let mut all = vec!["--kubeconfig", bob.to_str().expect("utf-8")];
        all.extend_from_slice(&["create", "-n", ns, "-f", "-"]);
        let mut child = std::process::Command::new(common::kubectl_bin())
            .args(&all)
            .arg("--cache-dir")
            .arg(s.dir.join("kube-cache"))
            .env("HOME", &s.dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        use std::io::Write;
        let _ = child.stdin.take().expect("stdin").write_all(pod.as_bytes());
        let out = child.wait_with_output().expect("kubectl exits");
        (out.status.success(), text(&out))
    };
    let (ok, out) = create("plant-a", ROOT_POD);
    assert!(!ok, "{out}");
    for part in [
        "pods \"root\" is forbidden: violates PodSecurity \"restricted:latest\"",
        "host namespaces (hostNetwork=true, hostPID=true)",
        "privileged (container \"c\" must not set securityContext.privileged=true)",
        "hostPath volumes (volume \"host\")",
        "allowPrivilegeEscalation != false",
    ] {
        assert!(out.contains(part), "{part} in {out}");
    }
    let (ok, out) = create("plant-b", ROOT_POD);
    assert!(
        !ok && out.contains("violates PodSecurity \"baseline:latest\"")
            && !out.contains("allowPrivilegeEscalation"),
        "{out}"
    );
    let (ok, out) = create("plant-c", ROOT_POD);
    assert!(
        ok && out.contains("Warning: would violate PodSecurity \"baseline:latest\""),
        "{out}"
    );
    let (ok, out) = create("plant-d", ROOT_POD);
    assert!(ok, "unlabelled: privileged, as kube-apiserver: {out}");
    // Refused pods were not stored (nothing reaches the gateway).
    let (_, listed) = as_user(&s, &bob, &["get", "pods", "-n", "plant-a", "-o", "name"]);
    assert!(!listed.contains("pod/root"), "{listed}");
    // A pod that keeps to restricted passes it; changing its spec later is judged again.
    let good = include_str!("manifests/good_pod.yaml");
    let (ok, out) = create("plant-a", good);
    assert!(ok, "{out}");
    let (ok, out) = as_user(
        &s,
        &bob,
        &["label", "pod", "good", "-n", "plant-a", "team=line-1"],
    );
    assert!(ok, "a label change is not judged: {out}");
}

/// An ImagePrePullJob's author who may not read a Secret had its registry username and password
/// delivered to nodes (cloudcore reads the Secret with its own rights). Now the job may name
/// only a Secret its author may `get`: kubectl as a user who may create jobs but not read the
/// Secret is refused naming it; once given `get` on that Secret, the job is stored.
#[test]
fn a_job_uses_only_secrets_its_author_may_read() {
    let s = Server::start();
    let out = s.kubectl_stdin(&["apply", "-f", "-"], OBJECTS);
    assert!(out.status.success(), "{}", text(&out));
    s.ok(&[
        "create",
        "clusterrole",
        "job-maker",
        "--verb=create,get,list,update,patch",
        "--resource=imageprepulljobs.operations.kubeedge.io",
    ]);
    s.ok(&[
        "create",
        "clusterrolebinding",
        "carol-jobs",
        "--clusterrole=job-maker",
        "--user=carol",
    ]);
    let carol = kubeconfig_for(&s, "carol", None);
    let job = |name: &str, secret: Option<&str>| {
        let file = s.dir.join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            format!(
                "apiVersion: operations.kubeedge.io/v1alpha2\nkind: ImagePrePullJob\nmetadata: {{name: {name}}}\nspec:\n  imagePrePullTemplate:\n    images: [\"busybox:1\"]\n    nodeNames: [n1]\n{}",
                secret.map_or(String::new(), |s| format!("    imageSecrets: {s}\n"))
            ),
        )
        .expect("job file");
        as_user(&s, &carol, &["create", "-f", file.to_str().expect("utf-8")])
    };
    let (ok, out) = job("pull-1", Some("default/s1"));
    assert!(
        !ok && out.contains("imageprepulljobs.operations.kubeedge.io \"pull-1\" is forbidden")
            && out.contains("names the Secret default/s1, which User \"carol\" may not get"),
        "{out}"
    );
    let (ok, out) = job("pull-2", None);
    assert!(ok, "a job without a Secret: {out}");
    s.ok(&[
        "create",
        "role",
        "s1-reader",
        "--verb=get",
        "--resource=secrets",
        "--resource-name=s1",
    ]);
    s.ok(&[
        "create",
        "rolebinding",
        "carol-s1",
        "--role=s1-reader",
        "--user=carol",
    ]);
    let (ok, out) = job("pull-3", Some("default/s1"));
    assert!(ok, "{out}");
    let (ok, out) = job("pull-4", Some("default/s2"));
    assert!(!ok && out.contains("default/s2"), "{out}");
}
