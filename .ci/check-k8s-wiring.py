"""Checks that deploy/k8s's manifests fit together, which a schema cannot see.

- every Secret a Deployment volume names is defined in deploy/k8s (with the
  keys the volume's items ask for);
- every file flag of ember-server in the container args (--tls-cert,
  --tls-key, --api-key-file, --model-dir) points under a volumeMount, and a
  Secret-backed mount holds the file the flag names;
- every probe and Service targetPort names a declared container port;
- --tls-cert and --tls-key come together.

Usage: python3 .ci/check-k8s-wiring.py deploy/k8s/*.yaml   (needs PyYAML; exits 1 on a problem)
"""

import sys

import yaml

FILE_FLAGS = ("--tls-cert", "--tls-key", "--api-key-file", "--model-dir")


def load(paths):
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs.extend(d for d in yaml.safe_load_all(f) if d)
    return docs


def secret_keys(docs):
    keys = {}
    for d in docs:
        if d.get("kind") == "Secret":
            data = dict(d.get("data") or {})
            data.update(d.get("stringData") or {})
            keys[d["metadata"]["name"]] = set(data)
    return keys


def flag_values(args):
    values = {}
    for a in args:
        if "=" in a:
            name, value = a.split("=", 1)
            values[name] = value
    return values


def check_container(c, volumes, secrets, problems):
    name = c["name"]
    ports = {p.get("name") for p in c.get("ports", [])}
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in c.get("volumeMounts", [])}
    flags = flag_values(c.get("args", []))
    if ("--tls-cert" in flags) != ("--tls-key" in flags):
        problems.append(f"{name}: --tls-cert and --tls-key must come together")
    for flag in FILE_FLAGS:
        path = flags.get(flag)
        if path is None:
            continue
        mount = next((m for m in mounts if path == m or path.startswith(m + "/")), None)
        if mount is None:
            problems.append(f"{name}: {flag}={path} is under no volumeMount")
            continue
        volume = volumes.get(mounts[mount], {})
        secret = volume.get("secret")
        if secret and path != mount:
            items = secret.get("items")
            files = {i["path"] for i in items} if items else secrets.get(secret["secretName"], set())
            rel = path[len(mount) + 1:]
            if rel not in files:
                problems.append(f"{name}: {flag}={path}: the Secret volume holds {sorted(files)}")
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(kind) or {}
        for handler in ("httpGet", "grpc", "tcpSocket"):
            port = (probe.get(handler) or {}).get("port")
            if isinstance(port, str) and port not in ports:
                problems.append(f"{name}: {kind} port {port!r} is not a container port {sorted(ports)}")
    return ports


def main(paths):
    docs = load(paths)
    secrets = secret_keys(docs)
    problems = []
    port_names = set()
    for d in docs:
        if d.get("kind") != "Deployment":
            continue
        spec = d["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            secret = v.get("secret")
            if not secret:
                continue
            have = secrets.get(secret["secretName"])
            if have is None:
                problems.append(f"volume {v['name']}: Secret {secret['secretName']} is not defined")
                continue
            for item in secret.get("items", []):
                if item["key"] not in have:
                    problems.append(f"volume {v['name']}: Secret {secret['secretName']} has no key {item['key']}")
        for c in spec["containers"]:
            port_names |= check_container(c, volumes, secrets, problems)
    for d in docs:
        if d.get("kind") == "Service":
            for p in d["spec"].get("ports", []):
                target = p.get("targetPort")
                if isinstance(target, str) and target not in port_names:
                    problems.append(f"Service {d['metadata']['name']}: targetPort {target!r} is no container port")
    for p in problems:
        print(f"check-k8s-wiring: {p}")
    print(f"check-k8s-wiring: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
