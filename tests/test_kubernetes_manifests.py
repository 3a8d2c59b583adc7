"""examples/kubernetes/: the manifests parse, agree with each other, and the command in
job.yaml is one the real ``fsmingle run`` (and torchrun, when installed) accepts.

No cluster is needed: the YAML is parsed with PyYAML, ``$(VAR)`` references are
expanded the way the kubelet does, the fsmingle part of the command is parsed by
the real Typer/Click app (without running it), and the settings are resolved with
the environment an Indexed Job's pod gets.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from fsmingle import config
from fsmingle.net import netaddr

K8S = Path(__file__).resolve().parents[1] / "examples" / "kubernetes"
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

# What the pods' env resolves to in this test (downward API values of a real pod).
SAMPLE = {"JOB_NAME": "ddp-train", "POD_IP": "10.244.1.17"}


def _docs(name: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
    assert docs, name
    return docs


@pytest.fixture(scope="module")
def job() -> dict:
    (j,) = _docs("job.yaml")
    return j


@pytest.fixture(scope="module")
def container(job) -> dict:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return c


def _env_values(container) -> dict:
    """Container env as the kubelet would set it, downward-API fields from SAMPLE."""
    out = {}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        else:
            out[e["name"]] = SAMPLE[e["name"]]
    return out


def _expand(argv: list[str], env: dict) -> list[str]:
    # The kubelet replaces $(VAR) with the container env's value; an undefined
    # reference stays as literal text, which is why every one must be defined.
    return [VAR_REF.sub(lambda m: env[m.group(1)], a) for a in argv]


def _argv(container) -> list[str]:
    argv = list(container.get("command", [])) + list(container.get("args", []))
    assert all(isinstance(a, str) for a in argv), "quote numbers in command/args: the API wants strings"
    return argv


def _split(argv):
    assert argv[:2] == ["fsmingle", "run"], argv
    i = argv.index("--")
    return argv[2:i], argv[i + 1 :]


def _parse_run(fsm_args: list[str]) -> dict:
    """Parse ``fsmingle run`` options with the real Click command, without running it."""
    import typer.main

    from fsmingle.cli import app

    group = typer.main.get_command(app)
    cmd = group.commands["run"]
    ctx = cmd.make_context("run", [*fsm_args, "--", "true"])
    return ctx.params


def test_all_files_parse_and_have_kinds():
    kinds = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in _docs(f.name):
            assert {"apiVersion", "kind", "metadata"} <= d.keys(), f
            kinds[d["kind"]] = d
    assert set(kinds) == {"Job", "PersistentVolumeClaim"}


def test_pvc_is_read_write_many_and_used_by_the_job(job):
    (pvc,) = _docs("pvc.yaml")
    assert pvc["apiVersion"] == "v1"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"]
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    claims = [v["persistentVolumeClaim"]["claimName"] for v in vols.values() if "persistentVolumeClaim" in v]
    assert claims == [pvc["metadata"]["name"]]


def test_job_is_indexed_and_sized_like_the_command(job, container):
    spec = job["spec"]
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    assert spec["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")
    params = _parse_run(_split(_expand(_argv(container), _env_values(container)))[0])
    assert params["nnodes"] == spec["completions"]
    assert params["node_rank"] is None  # comes from JOB_COMPLETION_INDEX


def test_every_variable_reference_is_defined(container):
    env = _env_values(container)
    refs = {m for a in _argv(container) for m in VAR_REF.findall(a)}
    assert refs >= {"JOB_NAME", "POD_IP"}
    assert refs <= env.keys(), f"undefined $(VAR) in command: {refs - env.keys()}"
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert fields["POD_IP"] == "status.podIP"
    assert fields["JOB_NAME"] in ("metadata.labels['job-name']", "metadata.labels['batch.kubernetes.io/job-name']")


def test_fsmingle_flags_parse_and_resolve_per_pod(container, job):
    argv = _expand(_argv(container), _env_values(container))
    fsm, cmd = _split(argv)
    p = _parse_run(fsm)
    assert p["dir"] == "/shared/rdzv" and p["job_id"] == SAMPLE["JOB_NAME"] and p["addr"] == SAMPLE["POD_IP"]
    assert p["iface"] is None and p["world_size"] is None and p["rank"] is None
    # --dir lies on the shared volume
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    vols = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    shared = [mounts[n] for n, v in vols.items() if "persistentVolumeClaim" in v]
    assert len(shared) == 1 and p["dir"].startswith(shared[0].rstrip("/") + "/")
    # each pod of the Indexed Job resolves to its own node rank, from JOB_COMPLETION_INDEX
    for index in range(job["spec"]["completions"]):
        pod_env = {**_env_values(container), "JOB_COMPLETION_INDEX": str(index)}
        s = config.resolve(
            dir=p["dir"],
            job_id=p["job_id"],
            nnodes=p["nnodes"],
            node_rank=p["node_rank"],
            world_size=p["world_size"],
            rank=p["rank"],
            env=pod_env,
        )
        assert (s.mode, s.size, s.rank, s.job_id) == ("node", 2, index, "ddp-train")
    assert netaddr.choose_address(addr=p["addr"], env={}) == SAMPLE["POD_IP"]
    # the command after "--" is torchrun; its workers-per-pod come from the env
    assert cmd[0] == "torchrun"
    assert cmd[cmd.index("--nproc-per-node") + 1] == _env_values(container)["NPROC_PER_NODE"]


def test_torchrun_part_parses(monkeypatch):
    """torchrun accepts the command, and nothing in it overrides the PET_* variables
    fsmingle exports (torchrun reads them as its flags' defaults when it builds its parser)."""
    torch_run = pytest.importorskip("torch.distributed.run")
    (j,) = _docs("job.yaml")
    (c,) = j["spec"]["template"]["spec"]["containers"]
    _, cmd = _split(_expand(_argv(c), _env_values(c)))
    for k in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(k)
    exported = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": SAMPLE["POD_IP"],
        "PET_MASTER_PORT": "29517",
    }
    for k, v in exported.items():
        monkeypatch.setenv(k, v)
    args = torch_run.get_args_parser().parse_args(cmd[1:])
    assert args.nproc_per_node == "2"
    assert args.training_script == "/app/train.py"
    assert args.training_script_args[:2] == ["--steps", "200"]
    assert (args.nnodes, args.node_rank, args.master_addr, args.master_port) == ("2", 1, SAMPLE["POD_IP"], 29517)
    assert args.rdzv_backend == "static" and not args.standalone


def test_readme_applies_files_that_exist():
    text = (K8S / "README.md").read_text()
    applied = re.findall(r"kubectl apply -f ([^\s`]+)", text)
    assert "examples/kubernetes/pvc.yaml" in applied and "examples/kubernetes/job.yaml" in applied
    root = K8S.parents[1]
    for a in applied:
        assert (root / a).is_file(), a
    # the pvc is applied before the job
    assert applied.index("examples/kubernetes/pvc.yaml") < applied.index("examples/kubernetes/job.yaml")
    # the command shown in the README is the one in job.yaml
    (j,) = _docs("job.yaml")
    (c,) = j["spec"]["template"]["spec"]["containers"]
    shown = re.search(r"^fsmingle run .*?(?=\n```)", text, re.S | re.M).group(0).replace("\\\n", " ")
    assert shlex.split(shown) == _argv(c)


def test_dockerfile_copies_what_job_runs():
    text = (K8S / "Dockerfile").read_text()
    assert "COPY examples/train_ddp.py /app/train.py" in text
    for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in src.split():
            assert (K8S.parents[1] / path).exists(), path
