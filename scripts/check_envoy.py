#!/usr/bin/env python3
"""Checks the files in envoy/ against Envoy's own API (xds-protos) and each other.

    check_envoy.py bootstrap FILE...     each parses into envoy.config.bootstrap.v3.Bootstrap
    check_envoy.py misspelled FILE       a copy with a misspelled field is refused, by name
    check_envoy.py plugin-configs        the sluice policies embedded in envoy/, as JSON lines
    check_envoy.py compose-and-workflows the compose file and the workflows are valid YAML, and
                                         every file they name exists
    check_envoy.py rate-limit-descriptors the native rate limit filters' domains and the
                                         descriptors their route actions send, as JSON lines

Run by `make test` (tests/e2e/envoy_config.rs) with the virtualenv scripts/setup.sh makes.
"""

import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path

import yaml
from google.protobuf import json_format

ROOT = Path(__file__).resolve().parent.parent
ENVOY = ROOT / "envoy"


def import_package_of(type_url):
    """Imports every *_pb2 module of the package that defines `type_url`, so that the
    descriptor pool can resolve an Any of that type."""
    full_name = type_url.rsplit("/", 1)[-1]
    package = full_name.rsplit(".", 1)[0]
    try:
        module = importlib.import_module(package)
    except ImportError:
        return
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        if info.name.endswith("_pb2"):
            importlib.import_module(f"{package}.{info.name}")


def typed_nodes(node):
    """Every mapping with an `@type` (an Any), at any depth."""
    if isinstance(node, dict):
        if isinstance(node.get("@type"), str):
            yield node
        for value in node.values():
            yield from typed_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from typed_nodes(value)


def type_urls(node):
    return (typed["@type"] for typed in typed_nodes(node))


def parse_bootstrap(document, source):
    from envoy.config.bootstrap.v3 import bootstrap_pb2

    for url in set(type_urls(document)):
        import_package_of(url)
    bootstrap = bootstrap_pb2.Bootstrap()
    # Unknown fields are errors (ignore_unknown_fields=False), as Envoy's own loader makes them.
    try:
        json_format.ParseDict(document, bootstrap, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        raise SystemExit(f"{source}: not a valid Envoy Bootstrap: {e}")
    return bootstrap


def parse_patches(path):
    """The Envoy resources an EnvoyPatchPolicy adds, each parsed as its declared type."""
    count = 0
    for document in yaml.safe_load_all(path.read_text()):
        if (document or {}).get("kind") != "EnvoyPatchPolicy":
            continue
        for patch in document["spec"]["jsonPatches"]:
            import_package_of(patch["type"])
            value = dict(patch["operation"]["value"], **{"@type": patch["type"]})
            for url in set(type_urls(value)):
                import_package_of(url)
            from google.protobuf import any_pb2

            try:
                json_format.ParseDict(value, any_pb2.Any(), ignore_unknown_fields=False)
            except json_format.ParseError as e:
                raise SystemExit(f"{path}: patch {patch['name']} is not a valid {patch['type']}: {e}")
            count += 1
    return count


def load_yaml(path):
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SystemExit(f"{path}: not valid YAML: {e}")


def bootstrap(paths):
    for path in sorted(ENVOY.glob("gateway/*.yaml")):
        if count := parse_patches(path):
            print(f"{path.relative_to(ROOT)}: {count} patch(es) valid against Envoy's API")
    for path in map(Path, paths):
        parsed = parse_bootstrap(load_yaml(path), path)
        filters = [
            f.name
            for listener in parsed.static_resources.listeners
            for chain in listener.filter_chains
            for f in chain.filters
        ]
        clusters = {c.name for c in parsed.static_resources.clusters}
        for policy in embedded_policies(load_yaml(path)):
            named = json.loads(policy).get("cluster")
            if named not in clusters:
                raise SystemExit(f"{path}: the sluice policy calls out to cluster {named!r}, which is not defined")
        print(
            f"{path}: a valid Bootstrap: {len(parsed.static_resources.listeners)} listener(s) "
            f"({', '.join(filters)}), {len(parsed.static_resources.clusters)} cluster(s)"
        )


def misspelled(path):
    """Misspells fields at three depths: top level, in a cluster, and inside the wasm filter's
    typed config (an Any). Each copy must be refused, the error naming the misspelling."""
    text = Path(path).read_text()
    for field, wrong in [
        ("static_resources:", "static_resource:"),
        ("connect_timeout:", "conect_timeout:"),
        ("root_id:", "root_idd:"),
        ("failure_policy:", "failure_polcy:"),
    ]:
        if field not in text:
            raise SystemExit(f"{path}: has no `{field}` to misspell")
        copy = yaml.safe_load(text.replace(field, wrong, 1))
        try:
            parse_bootstrap(copy, f"{path} with {wrong}")
        except SystemExit as e:
            message = str(e)
            name = wrong.rstrip(":")
            if name not in message:
                raise SystemExit(f"refused, but the error does not name `{name}`: {message}")
            print(f"`{name}` refused: {message.splitlines()[0][:160]}")
            continue
        raise SystemExit(f"{path} with `{wrong}` was accepted: misspellings go unnoticed")


def embedded_policies(document):
    """The plugin configurations of the wasm filters in an Envoy config (StringValues)."""
    for typed in typed_nodes(document):
        if typed["@type"].endswith("envoy.extensions.filters.http.wasm.v3.Wasm"):
            configuration = typed["config"]["configuration"]
            if not configuration.get("@type", "").endswith("google.protobuf.StringValue"):
                raise SystemExit("the wasm filter's configuration is not a google.protobuf.StringValue")
            yield configuration["value"]


def plugin_configs():
    """Every sluice policy in envoy/: the StringValue in each Envoy config, the pluginConfig of
    the Istio WasmPlugin, the config of the Envoy Gateway policy."""
    found = []
    for path in sorted(ENVOY.glob("*.yaml")):
        for policy in embedded_policies(load_yaml(path)):
            found.append({"source": str(path.relative_to(ROOT)), "config": policy})
    for path in sorted(ENVOY.glob("istio/*.yaml")) + sorted(ENVOY.glob("gateway/*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            kind = (document or {}).get("kind")
            if kind == "WasmPlugin":
                found.append({
                    "source": str(path.relative_to(ROOT)),
                    "config": json.dumps(document["spec"]["pluginConfig"]),
                })
            elif kind == "EnvoyExtensionPolicy":
                for wasm in document["spec"]["wasm"]:
                    found.append({
                        "source": str(path.relative_to(ROOT)),
                        "config": json.dumps(wasm["config"]),
                    })
    if not found:
        raise SystemExit("no sluice policy found in envoy/")
    for entry in found:
        print(json.dumps(entry))


# Tokens in shell commands that look like paths in this repository.
PATH_TOKEN = re.compile(r"(?:\.\./|\./)?[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+")


def named_files(command):
    for token in PATH_TOKEN.findall(command):
        if token.startswith(("http", "localhost")) or "://" in command.split(token)[0][-3:]:
            continue
        if "." in token.rsplit("/", 1)[-1] or token.endswith("/"):
            yield token


def check_compose(compose_path, problems):
    """A compose file: every service has an image or a build, and every file it builds from
    or mounts exists."""
    compose = load_yaml(compose_path)
    for name, service in compose.get("services", {}).items():
        if not isinstance(service, dict) or not ("image" in service or "build" in service):
            problems.append(f"{compose_path}: service {name} has neither image nor build")
            continue
        build = service.get("build")
        if isinstance(build, dict):
            context = (compose_path.parent / build.get("context", ".")).resolve()
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            if not dockerfile.exists():
                problems.append(f"{compose_path}: service {name} builds {dockerfile}, which is absent")
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                path = (compose_path.parent / source).resolve()
                # Build outputs exist once `make wasm` ran; everything else must be in the repo.
                if "target/" not in source and not path.exists():
                    problems.append(f"{compose_path}: service {name} mounts {source}, which is absent")
    print(f"{compose_path.relative_to(ROOT)}: valid YAML, {len(compose['services'])} services")


def compose_and_workflows():
    problems = []
    for compose_path in sorted(ENVOY.glob("docker-compose*.yml")):
        check_compose(compose_path, problems)

    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    if not workflows:
        problems.append(".github/workflows: no workflow")
    for path in workflows:
        workflow = load_yaml(path)
        steps = [s for job in workflow.get("jobs", {}).values() for s in job.get("steps", [])]
        if not steps:
            problems.append(f"{path}: no steps")
        checked = 0
        for step in steps:
            uses = step.get("uses", "")
            if uses.startswith("./") and not (ROOT / uses).exists():
                problems.append(f"{path}: step uses {uses}, which is absent")
            for token in named_files(step.get("run", "")):
                if token.startswith("target/"):
                    continue
                checked += 1
                if not (ROOT / token).exists():
                    problems.append(f"{path}: step `{step.get('name', step.get('run'))}` names {token}, which is absent")
        print(f"{path.relative_to(ROOT)}: valid YAML, {len(steps)} steps, {checked} named files present")
    if problems:
        raise SystemExit("\n".join(problems))


# What each rate limit action contributes to a descriptor, with a sample value (see Envoy's
# config.route.v3.RateLimit.Action).
def action_entry(action):
    if "remote_address" in action:
        return ["remote_address", "203.0.113.7"]
    if "request_headers" in action:
        return [action["request_headers"]["descriptor_key"], "sample"]
    if "generic_key" in action:
        generic = action["generic_key"]
        return [generic.get("descriptor_key", "generic_key"), generic["descriptor_value"]]
    if "header_value_match" in action:
        match = action["header_value_match"]
        return [match.get("descriptor_key", "header_match"), match["descriptor_value"]]
    if "source_cluster" in action:
        return ["source_cluster", "sample"]
    if "destination_cluster" in action:
        return ["destination_cluster", "sample"]
    raise SystemExit(f"an action this check does not know: {action}")


def rate_limit_descriptors():
    """For each Envoy config with envoy.filters.http.ratelimit: its domain and every descriptor
    a rate_limits entry (of a virtual host or a route) sends."""
    for path in sorted(ENVOY.glob("*.yaml")):
        document = load_yaml(path)
        filters = [
            node for node in typed_nodes(document)
            if node["@type"].endswith("envoy.extensions.filters.http.ratelimit.v3.RateLimit")
        ]
        if not filters:
            continue
        entries = []

        def collect(node):
            if isinstance(node, dict):
                for limit in node.get("rate_limits", []) if isinstance(node.get("rate_limits"), list) else []:
                    entries.append([action_entry(a) for a in limit.get("actions", [])])
                for value in node.values():
                    collect(value)
            elif isinstance(node, list):
                for value in node:
                    collect(value)

        collect(document)
        for limit_filter in filters:
            print(json.dumps({
                "source": str(path.relative_to(ROOT)),
                "domain": limit_filter["domain"],
                "descriptors": entries,
            }))


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    command, args = argv[1], argv[2:]
    if command == "bootstrap":
        bootstrap(args or [ENVOY / "envoy.yaml"])
    elif command == "misspelled":
        misspelled(args[0] if args else ENVOY / "envoy.yaml")
    elif command == "plugin-configs":
        plugin_configs()
    elif command == "compose-and-workflows":
        compose_and_workflows()
    elif command == "rate-limit-descriptors":
        rate_limit_descriptors()
    else:
        raise SystemExit(f"unknown command {command}\n{__doc__}")


if __name__ == "__main__":
    main(sys.argv)
