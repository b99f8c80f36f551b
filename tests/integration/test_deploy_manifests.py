#!/usr/bin/env python3
"""The scale-out examples (deploy/k8s/*.yaml, deploy/compose/fleet.yml) are valid and name real flags.

Without any download (python3-yaml from Debian; without it the test re-runs itself in the checker
venv below, which has PyYAML):
  - every YAML file under deploy/ parses; the kustomization's resources exist;
  - every `--flag` a graphswap container passes (args / command, and the graphswap-join script that
    picks --weights-from) is one `graphswap serve --help` documents (--weights-from,
    --weights-from-key and --weights-from-timeout are reported as pending, not failed, while the
    binary does not document --weights-from yet);
  - Kubernetes: the replicas' readinessProbe is GET /health?ready=1 and the liveness / startup
    probes GET /health, on the container's named port, which is the --port given; a non-loopback
    --host comes with GRAPHSWAP_ADMIN_KEY and GRAPHSWAP_WEIGHTS_FROM_KEY from a Secret (the weight
    routes and the peer copy need it); the
    headless Service (not-ready pods listed) selects the pod labels and GS_PEERS_DNS names it; the
    router discovers pods by those labels on that port, health-checks /health (not ?ready=1: 503
    during every update), and its service account is bound to a Role with get / list / watch on pods;
  - compose: every replica's --port is its GS_PORT and its healthcheck reads /health?ready=1, its
    GS_PEERS are the other replicas, the router's --worker-urls are exactly the replicas and it
    health-checks /health, and the build contexts hold Dockerfiles;
  - the probe paths answer 200 from a running `graphswap serve` (a small model);
  - the graphswap-join script (both copies, compose's "$$" unescaped): `sh -n`, then run with a stub
    `graphswap` on PATH: with a live peer (after a dead one and one that is itself pulling, a fake
    answering /health {"status": "pulling"}) it execs `serve ARGS --weights-from PEER
    --weights-from-timeout S`, with only dead or pulling peers `serve ARGS` alone; the Kubernetes
    copy also finds the peer through GS_PEERS_DNS (localhost here) (needs curl); and, where the
    binary has --weights-from, the Kubernetes copy with the real binary: it finds the peer (which
    serves a disk-loaded checkpoint as version live-7) through GS_PEERS_DNS, becomes ready with the
    peer's version and checkpoint checksums, and exits 0 on SIGTERM;
With the checkers from PyPI (a venv cached in GS_TEST_TMP/../venv-deploy; SKIPPED, exit 77, when they
cannot be installed, after the checks above passed):
  - kubernetes-validate --strict (the Kubernetes OpenAPI schemas it ships) on every manifest but the
    kustomization; check-jsonschema --builtin-schema vendor.compose-spec (the compose spec it ships)
    on deploy/compose/fleet.yml and docker-compose.yml;
  - every flag the router containers pass is in sglang-router 0.3.2's `launch_router --help`.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
SRC = os.environ.get("GS_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
DEPLOY = os.path.join(SRC, "deploy")
CHECKERS = ["kubernetes-validate", "check-jsonschema", "sglang-router==0.3.2"]
PENDING = {"--weights-from", "--weights-from-key", "--weights-from-timeout"}  # the peer copy (issue 24)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

try:
    import yaml
except ImportError:
    yaml = None

import test_http_basic as H  # noqa: E402


def venv_python(quiet=False):
    """The checkers' venv python, or None (with the reason printed) when it cannot be had."""
    base = os.environ.get("GS_TEST_TMP") or "/tmp/gs-deploy"
    venv = os.path.join(os.path.dirname(os.path.abspath(base)), "venv-deploy")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        p = subprocess.run(["/usr/bin/python3", "-m", "venv", venv], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print("SKIP: cannot make a venv for the schema checkers: %s" % p.stderr.strip()[-300:])
            return None
    p = subprocess.run([py, "-c", "import kubernetes_validate, check_jsonschema, sglang_router, yaml"],
                       capture_output=True)
    if p.returncode != 0:
        p = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + CHECKERS,
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            print("SKIP: %s cannot be installed from PyPI here: %s" % (", ".join(CHECKERS), p.stderr.strip()[-400:]))
            return None
    return py


def interpolate(s):
    """compose's ${VAR:-default} / ${VAR:?msg} / ${VAR} with the defaults (and "$$" -> "$")."""
    if not isinstance(s, str):
        return s
    s = re.sub(r"(?<!\$)\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", s)
    return s.replace("$$", "$")


def flags_of(tokens):
    out = set()
    for t in tokens:
        if isinstance(t, str):
            out |= set(FLAG.findall(t))
    return out


def check_flags(C, what, used, documented, note):
    for f in sorted(used):
        if f in documented:
            C.check(True, "")
        elif f in PENDING and "--weights-from" not in documented:
            note.add(f)
        else:
            C.fail("%s passes %s, which `graphswap serve --help` does not document" % (what, f))


def arg_after(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if isinstance(a, str) and a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def join_script(command):
    """The graphswap-join script of a /bin/sh -c command list, or None."""
    if isinstance(command, list) and len(command) >= 3 and command[0] == "/bin/sh" and command[1] == "-c":
        return command[2]
    return None


# ---------------------------------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------------------------------

def check_k8s(C, docs, documented, note, probes):
    objs = [d for d in docs if isinstance(d, dict) and d.get("kind")]
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs if o.get("metadata", {}).get("name")}
    dep = by.get(("Deployment", "graphswap"))
    svc = by.get(("Service", "graphswap"))
    rdep = by.get(("Deployment", "graphswap-router"))
    if not C.check(dep and svc and rdep, "deploy/k8s has Deployment graphswap, Service graphswap and Deployment "
                                         "graphswap-router: %r" % sorted(by)):
        return
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    C.check(dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), "the Deployment selects its pods")
    C.check(svc["spec"]["selector"].items() <= labels.items(), "Service graphswap selects the replicas")
    for c in pod["spec"]["containers"]:
        if not str(c.get("image", "")).startswith("graphswap"):
            continue
        args = [str(a) for a in c.get("args", [])]
        script = join_script(c.get("command"))
        C.check(script is not None and "graphswap serve" in script, "the replica runs graphswap serve through "
                                                                    "the graphswap-join script")
        check_flags(C, "the k8s replica", flags_of(args) | flags_of([script or ""]), documented, note)
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        C.check(str(ports.get("http")) == arg_after(args, "--port"), "containerPort http %r is --port %r"
                % (ports.get("http"), arg_after(args, "--port")))
        env = {e["name"]: e for e in c.get("env", [])}
        if arg_after(args, "--host") not in ("127.0.0.1", "::1", None):
            for k in ("GRAPHSWAP_ADMIN_KEY", "GRAPHSWAP_WEIGHTS_FROM_KEY"):
                C.check(k in env and "secretKeyRef" in env[k].get("valueFrom", {}),
                        "a non-loopback --host comes with %s from a Secret" % k)
        want = {"readinessProbe": "/health?ready=1", "livenessProbe": "/health", "startupProbe": "/health"}
        for probe, path in want.items():
            g = (c.get(probe) or {}).get("httpGet") or {}
            C.check(g.get("path") == path and g.get("port") in ports,
                    "%s is GET %s on a named container port: %r" % (probe, path, g))
            if g.get("path"):
                probes.add(g["path"])
        dns = env.get("GS_PEERS_DNS", {}).get("value")
        pport = env.get("GS_PEERS_PORT", {}).get("value")
        sport = svc["spec"]["ports"][0]
        C.check(dns == svc["metadata"]["name"] and pport == str(sport["port"]) == arg_after(args, "--port")
                and sport["targetPort"] in ports, "GS_PEERS_DNS / GS_PEERS_PORT name Service graphswap on the "
                                                   "replicas' port: %r %r" % (dns, pport))
        C.check(svc["spec"].get("clusterIP") == "None" and svc["spec"].get("publishNotReadyAddresses") is True,
                "Service graphswap is headless and lists not-ready pods (a replica taking an update is a source)")
        mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
        for flag in ("--model", "--weights-root"):
            v = arg_after(args, flag) or ""
            C.check(any(v == m or v.startswith(m.rstrip("/") + "/") for m in mounts),
                    "%s %s lies on a mounted volume %r" % (flag, v, mounts))
    # the router: pod discovery by those labels on that port, /health?ready=1, RBAC
    rc = rdep["spec"]["template"]["spec"]["containers"][0]
    rargs = [str(a) for a in rc.get("args", [])]
    C.check("--service-discovery" in rargs, "the router discovers the replicas (--service-discovery)")
    sel = arg_after(rargs, "--selector") or ""
    k, _, v = sel.partition("=")
    C.check(labels.get(k) == v, "the router's --selector %r matches the replicas' labels %r" % (sel, labels))
    C.check(arg_after(rargs, "--service-discovery-port") == arg_after(
        [str(a) for a in pod["spec"]["containers"][0].get("args", [])], "--port"),
        "--service-discovery-port is the replicas' --port")
    C.check(arg_after(rargs, "--health-check-endpoint") in (None, "/health"),
            "the router health-checks /health (200 while a replica takes an update)")
    sa = rdep["spec"]["template"]["spec"].get("serviceAccountName")
    rb = [o for o in objs if o["kind"] == "RoleBinding" and any(s.get("name") == sa for s in o.get("subjects", []))]
    ok = False
    for b in rb:
        role = by.get((b["roleRef"]["kind"], b["roleRef"]["name"]))
        for rule in (role or {}).get("rules", []):
            if "pods" in rule.get("resources", []) and {"get", "list", "watch"} <= set(rule.get("verbs", [])):
                ok = True
    C.check(ok, "the router's service account %r may get / list / watch pods" % sa)
    return rargs


# ---------------------------------------------------------------------------------------------------
# compose
# ---------------------------------------------------------------------------------------------------

def check_compose(C, path, doc, documented, note, probes):
    base = os.path.dirname(path)
    services = doc.get("services", {})
    reps = {n: s for n, s in services.items() if str(s.get("image", "")).startswith("graphswap:")}
    C.check(len(reps) >= 2 and "router" in services, "fleet.yml has replicas and a router: %r" % sorted(services))
    urls = {}
    for n, s in sorted(reps.items()):
        args = [interpolate(str(a)) for a in s.get("command", [])]
        script = join_script(s.get("entrypoint"))
        C.check(script is not None and "graphswap serve" in script, "%s runs graphswap serve through graphswap-join" % n)
        check_flags(C, "compose %s" % n, flags_of(args) | flags_of([interpolate(script or "")]), documented, note)
        env = {k: interpolate(str(v)) for k, v in (s.get("environment") or {}).items()}
        port = arg_after(args, "--port")
        C.check(env.get("GS_PORT") == port, "%s: GS_PORT %r is --port %r" % (n, env.get("GS_PORT"), port))
        host = arg_after(args, "--host")
        urls[n] = "http://%s:%s" % (host, port)
        hc = " ".join(s.get("healthcheck", {}).get("test", []))
        C.check("/health?ready=1" in hc, "%s's healthcheck reads /health?ready=1: %r" % (n, hc))
        probes.add("/health?ready=1")
        ctx = (s.get("build") or {}).get("context")
        C.check(ctx and os.path.exists(os.path.join(base, ctx, "Dockerfile")), "%s builds from a Dockerfile: %r" % (n, ctx))
        s["_peers"] = env.get("GS_PEERS", "").split()
    for n, s in reps.items():
        C.check(set(s["_peers"]) == set(urls.values()) - {urls[n]}, "%s's GS_PEERS %r are the other replicas"
                % (n, s["_peers"]))
    r = services.get("router", {})
    rargs = [interpolate(str(a)) for a in r.get("command", [])]
    i = rargs.index("--worker-urls") if "--worker-urls" in rargs else len(rargs)
    wu = []
    for a in rargs[i + 1:]:
        if a.startswith("--"):
            break
        wu.append(a)
    C.check(sorted(wu) == sorted(urls.values()), "the router's --worker-urls %r are the replicas %r" % (wu, urls))
    C.check(arg_after(rargs, "--health-check-endpoint") in (None, "/health"), "the compose router health-checks "
                                                                              "/health")
    ctx = (r.get("build") or {}).get("context")
    C.check(ctx and os.path.exists(os.path.join(base, ctx, "Dockerfile")), "the router builds from a Dockerfile")
    return rargs


# ---------------------------------------------------------------------------------------------------
# the join script, run
# ---------------------------------------------------------------------------------------------------

class PullingPeer:
    """A fake replica that is alive but still pulling: GET /health 200 {"status": "pulling"}."""

    def __init__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b'{"status":"pulling","ready":false}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_join(C, what, script, live_url, tmp):
    p = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
    C.check(p.returncode == 0, "%s: sh -n: %s" % (what, p.stderr))
    if not shutil.which("curl"):
        print("NOTE: no curl here: the graphswap-join script was only syntax-checked")
        return
    stub_dir = tempfile.mkdtemp(dir=tmp)
    stub = os.path.join(stub_dir, "graphswap")
    with open(stub, "w") as f:
        f.write('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    os.chmod(stub, 0o755)
    env = dict(os.environ, PATH=stub_dir + os.pathsep + os.environ.get("PATH", ""))
    for k in ("GS_PEERS", "GS_PEERS_DNS", "GS_PEERS_PORT"):
        env.pop(k, None)
    args = ["--model", "/m", "--port", "1"]

    def run(**kw):
        p = subprocess.run(["sh", "-c", script, "graphswap-join"] + args, env=dict(env, **kw),
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout.split("\n")[:-1]

    def copies(out, src):
        return out[:5] == ["serve"] + args and arg_after(out, "--weights-from") == src and "--weights-from-timeout" in out

    dead = "http://127.0.0.1:9"  # the discard port: nothing listens
    pulling = PullingPeer()
    try:
        rc, out = run(GS_PEERS=dead)
        C.check(rc == 0 and out == ["serve"] + args, "%s without a live peer starts from --model: %r" % (what, out))
        rc, out = run(GS_PEERS=pulling.url)
        C.check(rc == 0 and out == ["serve"] + args, "%s with only a pulling peer starts from --model: %r" % (what, out))
        rc, out = run(GS_PEERS="%s %s %s" % (dead, pulling.url, live_url))
        C.check(rc == 0 and copies(out, live_url), "%s copies from the live peer (after a dead and a pulling one): %r"
                % (what, out))
        if "GS_PEERS_DNS" in script:
            port = live_url.rsplit(":", 1)[1]
            rc, out = run(GS_PEERS_DNS="localhost", GS_PEERS_PORT=port)
            C.check(rc == 0 and copies(out, "http://127.0.0.1:%s" % port),
                    "%s finds the live peer through GS_PEERS_DNS: %r" % (what, out))
    finally:
        pulling.close()


def join_for_real(C, binary, script, model, peer, tmp):
    """The Kubernetes graphswap-join script with the real binary: through GS_PEERS_DNS (localhost)
    it finds the peer, starts `serve --weights-from` it, reports ready once it holds the peer's
    version and weights (checkpoint checksums), and stops cleanly on SIGTERM (exec: no shell left)."""
    import json
    import re
    import signal
    import threading
    import time

    bindir = tempfile.mkdtemp(dir=tmp)
    os.symlink(binary, os.path.join(bindir, "graphswap"))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), GS_PEERS_DNS="localhost",
               GS_PEERS_PORT=str(peer.port), GS_WEIGHTS_FROM_TIMEOUT="60")
    for k in ("GS_PEERS", "GRAPHSWAP_API_KEY", "GRAPHSWAP_ADMIN_KEY", "GRAPHSWAP_WEIGHTS_FROM_KEY"):
        env.pop(k, None)
    proc = subprocess.Popen(["sh", "-c", script, "graphswap-join", "--model", model, "--host", "127.0.0.1", "--port",
                             "0", "--threads", "1", "--kv-cache-mb", "16"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log, got = [], threading.Event()
    port = []

    def drain():
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace")
            log.append(line)
            m = re.search(r"on http://\S+:(\d+)", line)
            if m and not port:
                port.append(int(m.group(1)))
                got.set()
        got.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        got.wait(60)
        if not C.check(port, "the joined replica did not start: %s" % "".join(log)[-2000:]):
            return
        C.check(any("copying the live weights from http://127.0.0.1:%d" % peer.port in l for l in log),
                "graphswap-join found the peer through GS_PEERS_DNS: %s" % "".join(log)[-1500:])

        class Srv:  # what H.get needs
            def conn(self, timeout=60):
                import http.client
                return http.client.HTTPConnection("127.0.0.1", port[0], timeout=timeout)

        j = Srv()
        t0, ok = time.time(), False
        while time.time() - t0 < 60 and not ok:
            try:
                ok = H.get(j, "/health?ready=1").status == 200
            except OSError:
                pass
            if not ok:
                time.sleep(0.1)
        C.check(ok, "the joined replica became ready: %s" % "".join(log)[-1500:])
        w = H.get(j, "/v1/weights").json or {}
        C.check(w.get("version") == "live-7", "the joined replica holds the peer's version live-7: %r" % w)
        a = H.get(j, "/v1/weights/checksums?names=checkpoint").json
        b = H.get(peer, "/v1/weights/checksums?names=checkpoint").json
        C.check(a is not None and a == b, "the joined replica's checkpoint checksums equal the peer's")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        C.check(rc == 0, "the joined replica exits 0 on SIGTERM (the script exec'd it): %r" % rc)


def main():
    C = H.Checker("deploy_manifests")
    if yaml is None:
        if os.environ.get("GS_DEPLOY_IN_VENV"):
            C.fail("PyYAML is missing in the checker venv")
            return C.finish()
        py = venv_python()
        if py is None:
            print("SKIP: no python3-yaml (apt-get install python3-yaml) and no venv to parse the YAML with")
            return 77
        os.environ["GS_DEPLOY_IN_VENV"] = "1"
        os.execv(py, [py, os.path.abspath(__file__)])
    binary = H.gs_bin(C)
    p = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=30)
    documented = set(FLAG.findall(p.stdout + p.stderr))
    C.check("--model" in documented and "--weights-root" in documented, "serve --help lists its flags")
    files = sorted(glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True) +
                   glob.glob(os.path.join(DEPLOY, "**", "*.yml"), recursive=True))
    C.check(len(files) >= 4, "deploy/ holds the manifests: %r" % files)
    parsed = {}
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                parsed[f] = [d for d in yaml.safe_load_all(fh) if d is not None]
            C.check(parsed[f], "%s holds a document" % f)
        except yaml.YAMLError as e:
            C.fail("%s does not parse: %s" % (f, e))
    note, probes = set(), set()
    k8s_docs, kust = [], None
    for f, docs in parsed.items():
        if os.sep + "k8s" + os.sep in f:
            if os.path.basename(f) == "kustomization.yaml":
                kust = docs[0]
            else:
                k8s_docs += docs
    if C.check(kust is not None, "deploy/k8s/kustomization.yaml"):
        for r in kust.get("resources", []):
            C.check(os.path.exists(os.path.join(DEPLOY, "k8s", r)), "the kustomization's %s exists" % r)
    k8s_router = check_k8s(C, k8s_docs, documented, note, probes) or []
    fleet = os.path.join(DEPLOY, "compose", "fleet.yml")
    compose_router = []
    if C.check(fleet in parsed, "deploy/compose/fleet.yml"):
        compose_router = check_compose(C, fleet, parsed[fleet][0], documented, note, probes)
    if note:
        print("PENDING: %s: not in this binary's `serve --help` yet (the peer copy, --weights-from)"
              % ", ".join(sorted(note)), flush=True)
    # the probe paths on a running server (holding weights that are not its --model's: a disk load
    # with a version), and the join scripts
    tmp = H.scratch("deploy_manifests")
    model = H.mkmodel(C, binary, os.path.join(tmp, "ckpts", "model"))
    H.mkmodel(C, binary, os.path.join(tmp, "ckpts", "live"), extra=["--seed", "7"])
    srv = H.Server(C, binary, model, ["--threads", "1", "--kv-cache-mb", "16", "--weights-root",
                                      os.path.join(tmp, "ckpts")])
    try:
        r = H.post(srv, "/v1/weights/load", {"path": "live", "version": "live-7"})
        C.check(r.status == 200, "the peer loads the live weights: %r" % r)
        for path in sorted(probes):
            r = H.get(srv, path)
            C.check(r.status == 200, "probe GET %s on a loaded server: %r" % (path, r))
        peer = "http://127.0.0.1:%d" % srv.port
        k8s_script = None
        for what, f, key in (("k8s graphswap-join", os.path.join(DEPLOY, "k8s", "graphswap.yaml"), "command"),
                             ("compose graphswap-join", fleet, "entrypoint")):
            for d in parsed.get(f, []):
                if what.startswith("k8s") and d.get("kind") == "Deployment" and d["metadata"]["name"] == "graphswap":
                    k8s_script = join_script(d["spec"]["template"]["spec"]["containers"][0]["command"])
                    run_join(C, what, k8s_script, peer, tmp)
                elif what.startswith("compose") and "services" in d:
                    s = d["services"]["graphswap-1"]
                    run_join(C, what, join_script(s[key]).replace("$$", "$"), peer, tmp)
        if k8s_script and "--weights-from" in documented and shutil.which("curl"):
            join_for_real(C, binary, k8s_script, model, srv, tmp)
        elif "--weights-from" not in documented:
            print("PENDING: the graphswap-join script not run with the real binary (no --weights-from)", flush=True)
    finally:
        H.stop_clean(C, srv)
        H._kill_all()
    if C.failed:
        return C.finish()
    # the schema checkers from PyPI
    py = venv_python()
    if py is None:
        C.finish()
        return 77
    vbin = os.path.dirname(py)
    k8s_files = [f for f in parsed if os.sep + "k8s" + os.sep in f and os.path.basename(f) != "kustomization.yaml"]
    p = subprocess.run([os.path.join(vbin, "kubernetes-validate"), "--strict", "--quiet"] + k8s_files,
                       capture_output=True, text=True, timeout=300)
    C.check(p.returncode == 0, "kubernetes-validate --strict: %s%s" % (p.stdout[-2000:], p.stderr[-1000:]))
    compose = [fleet, os.path.join(SRC, "docker-compose.yml")]
    p = subprocess.run([os.path.join(vbin, "check-jsonschema"), "--builtin-schema", "vendor.compose-spec"] + compose,
                       capture_output=True, text=True, timeout=300)
    C.check(p.returncode == 0, "check-jsonschema vendor.compose-spec: %s%s" % (p.stdout[-2000:], p.stderr[-1000:]))
    p = subprocess.run([py, "-m", "sglang_router.launch_router", "--help"], capture_output=True, text=True, timeout=120)
    rflags = set(FLAG.findall(p.stdout))
    if C.check("--worker-urls" in rflags, "sglang-router --help: %s" % p.stderr[-500:]):
        for what, args in (("k8s", k8s_router), ("compose", compose_router)):
            for f in sorted(flags_of(args)):
                C.check(f in rflags, "the %s router passes %s, which sglang-router 0.3.2 does not know" % (what, f))
    vers = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('kubernetes-validate'), "
                                     "m.version('check-jsonschema'))"], capture_output=True, text=True)
    print("kubernetes-validate %s, check-jsonschema %s" % tuple((vers.stdout.split() + ["?", "?"])[:2]))
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
