"""The typed worker plan -> local process plans: the pure half of `braintrain run`."""

from pathlib import Path

import pytest
import yaml
from brain_operator.local.run import planner
from brain_operator.local.plan import (
    localize,
    plan_local,
    process_env,
    rewrite_path,
)
from brain_operator.backends import render_elastic
from brain_operator.spec import parse_job, trainer_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-minimal.yaml"
WORKDIR = Path("/work/runs/demo")
CLAIMS = Path("/work/runs/claims")
# The example's volumeClaimTemplate makes the claim <job>-checkpoints.
CLAIM = CLAIMS / "local-minimal-checkpoints"
PYTHON = "/venv/bin/python"
RENDEZVOUS = WORKDIR / "rendezvous" / "attempt"


def manifest(**spec_changes):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["spec"].update(spec_changes)
    return data


def plan(**spec_changes):
    job = parse_job(manifest(**spec_changes), require_image=False)
    return plan_local(job, workdir=WORKDIR, claims=CLAIMS, rendezvous=RENDEZVOUS, metrics_port=41235, python=PYTHON,
                      cpu_count=8)


def local_trainer_yaml(p):
    return yaml.safe_load(p.files[WORKDIR / "config" / "trainer.yaml"])


def test_each_worker_pod_becomes_a_torchrun_agent_with_the_pods_args():
    p = plan()
    assert [w.name for w in p.workers] == ["local-minimal-worker-0", "local-minimal-worker-1"]
    for worker in p.workers:
        # torchrun's agent, run by brain_trainer.agent: quiet when the runner stops it.
        assert worker.argv == [
            PYTHON, "-m", "brain_trainer.agent", "-m", "brain_trainer", "--config", str(WORKDIR / "config" / "trainer.yaml"),
        ]


def test_the_rendezvous_is_the_attempts_file_store_under_the_jobs_run_id():
    p = plan()
    env0, env1 = (w.env for w in p.workers)
    # No port that another run could take between its choice and pod 0's bind, and a store no other run shares.
    assert env0["PET_RDZV_ENDPOINT"] == env1["PET_RDZV_ENDPOINT"] == str(RENDEZVOUS) == str(p.rendezvous)
    assert env0["PET_RDZV_CONF"] == env1["PET_RDZV_CONF"] == "store_type=file,join_timeout=1800,read_timeout=1800"
    # The job's run id, as in a cluster (its uid there): the goodput ledger's account across the run's restarts.
    assert env0["PET_RDZV_ID"] == env1["PET_RDZV_ID"] == "local-minimal"
    assert env0["PET_LOCAL_ADDR"] == "127.0.0.1"
    assert env0["PET_NNODES"] == "2:2" and env0["PET_NPROC_PER_NODE"] == "1"
    # The cores are split between the two processes.
    assert env0["OMP_NUM_THREADS"] == env1["OMP_NUM_THREADS"] == "4"


def test_each_attempt_gets_a_rendezvous_file_of_its_own(tmp_path):
    plan_for = planner(manifest(), base_dir=EXAMPLE.parent, workdir=tmp_path / "run", metrics_port=41235)
    first, second = plan_for(), plan_for()
    assert first.rendezvous.parent == second.rendezvous.parent == tmp_path / "run" / "rendezvous"
    assert first.rendezvous != second.rendezvous  # a restarted group never reads the dead group's rendezvous


def test_the_pod_env_is_carried_over_except_what_must_change_locally():
    job = parse_job(manifest(), require_image=False)
    pods = [o for o in render_elastic(job) if o["kind"] == "Pod"]
    p = plan()
    local_only = {"PET_RDZV_ENDPOINT", "PET_RDZV_CONF", "PET_LOCAL_ADDR", "BRAIN_PROGRESS_FILE", "BRAIN_TERMINATION_LOG",
                  "OMP_NUM_THREADS", "BRAIN_LEASE_HOLDER"}
    for pod, worker in zip(pods, p.workers):
        pod_env = {v["name"]: v["value"] for v in pod["spec"]["containers"][0]["env"]}
        assert {k: v for k, v in worker.env.items() if k not in local_only} == {
            k: v for k, v in pod_env.items() if k not in local_only
        }
        # The holder of the checkpoint claim is the work directory here, the uid in a cluster.
        assert worker.env["BRAIN_LEASE_HOLDER"] == f"job local-minimal ({p.workdir})"


def test_no_in_pod_path_or_cluster_dns_name_survives():
    job = parse_job(manifest(), require_image=False)
    objects = render_elastic(job)
    pod = next(o for o in objects if o["kind"] == "Pod")
    in_pod = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]
    p = plan()
    text = yaml.safe_dump([[w.argv, w.env] for w in p.workers]) + "".join(p.files.values())
    for path in in_pod:
        assert f" {path}" not in text and f"'{path}" not in text, path
    assert ".local-minimal-workers" not in text


def test_volumes_become_folders_under_the_workdir_and_claims_under_the_claims_folder():
    p = plan()
    assert p.checkpoint_dir == CLAIM
    assert p.dirs == [CLAIM, WORKDIR / "config", WORKDIR / "rendezvous", WORKDIR / "termination"]
    assert p.workers[1].scratch_dirs == [WORKDIR / "tmp" / "local-minimal-worker-1" / "dshm"]
    assert p.progress_file == WORKDIR / "progress.json"
    assert all(w.env["BRAIN_PROGRESS_FILE"] == str(p.progress_file) for w in p.workers)
    # Each pod's termination message file, where its trainers say why they ended.
    assert [w.env["BRAIN_TERMINATION_LOG"] for w in p.workers] == [
        str(WORKDIR / "termination" / f"local-minimal-worker-{i}") for i in range(2)]
    assert [w.termination_log for w in p.workers] == [WORKDIR / "termination" / f"local-minimal-worker-{i}" for i in range(2)]


def test_trainer_yaml_is_the_rendered_one_with_local_paths_and_port():
    job = parse_job(manifest(), require_image=False)
    expected = trainer_config(job).to_dict()
    local = local_trainer_yaml(plan())
    assert local["checkpoint"]["dir"] == str(CLAIM)
    assert local["metrics"]["port"] == 41235
    # A laptop's metrics and progress are for itself: loopback, where a pod listens on every interface.
    assert expected["metrics"]["bind_address"] == "0.0.0.0"
    assert local["metrics"]["bind_address"] == "127.0.0.1"
    expected["checkpoint"]["dir"] = local["checkpoint"]["dir"]
    expected["metrics"]["port"] = 41235
    expected["metrics"]["bind_address"] = "127.0.0.1"
    assert local == expected


def test_checkpoints_are_shared_even_when_the_cluster_would_use_pod_scratch():
    # Without a claim the rendered checkpoint volume is an emptyDir; locally it
    # must still be one folder every worker writes, or resuming would be impossible.
    p = plan(nodes=1, checkpoint={"mountPath": "/ckpt"})
    assert p.checkpoint_dir == WORKDIR / "checkpoints"
    assert local_trainer_yaml(p)["checkpoint"]["dir"] == str(WORKDIR / "checkpoints")
    assert p.workers[0].scratch_dirs == [WORKDIR / "tmp" / "local-minimal-worker-0" / "dshm"]


@pytest.mark.parametrize("tensorboard, local", [
    ("/checkpoints/tensorboard", str(CLAIM / "tensorboard")),  # on the claim: its local folder
    ("tensorboard", "tensorboard"),  # relative: below the work directory, where the trainers run
])
def test_the_tensorboard_folder_is_moved_like_any_in_pod_path(tensorboard, local):
    p = plan(metrics={"tensorboardDir": tensorboard})
    assert local_trainer_yaml(p)["metrics"]["tensorboard_dir"] == local


def test_a_named_claim_is_the_folder_of_that_name_in_the_claims_folder():
    p = plan(checkpoint={"claimName": "shared-ckpt"})
    assert p.checkpoint_dir == CLAIMS / "shared-ckpt"
    assert local_trainer_yaml(p)["checkpoint"]["dir"] == str(CLAIMS / "shared-ckpt")


def test_checkpoints_in_an_object_store_pass_through_with_the_users_own_endpoint_and_credentials():
    # The trainer reaches the store; the manifest's endpoint and Secret are the cluster's, the user's shell is here.
    p = plan(checkpoint={"uri": "s3://team-ckpt/local-minimal"},
             objectStore={"endpoint": "http://minio.storage:9000", "credentialsSecret": "minio-keys"})
    assert p.checkpoint_dir is None and WORKDIR / "checkpoints" not in p.dirs
    assert local_trainer_yaml(p)["checkpoint"]["dir"] == "s3://team-ckpt/local-minimal"
    mine = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "me", "AWS_SECRET_ACCESS_KEY": "mine"}
    for worker in p.workers:
        assert "AWS_ENDPOINT_URL" not in worker.env
        assert mine.items() <= process_env({"PATH": "/usr/bin", **mine}, worker).items()


def test_steps_name_and_budget_come_through():
    p = plan(training={"steps": 77}, runPolicy={"backoffLimit": 2})
    assert (p.job_name, p.total_steps, p.backoff_limit) == ("local-minimal", 77, 2)


def test_rewrite_path_respects_path_boundaries():
    mounts = {"/checkpoints": Path("/w/checkpoints"), "/etc/brain": Path("/w/config"), "/etc/brain/x/": Path("/w/x")}
    assert rewrite_path("/checkpoints", mounts) == "/w/checkpoints"
    assert rewrite_path("/checkpoints/step-00000010", mounts) == "/w/checkpoints/step-00000010"
    assert rewrite_path("/checkpoints2", mounts) == "/checkpoints2"
    assert rewrite_path("/etc/brain/x/y", mounts) == "/w/x/y"  # the deepest mount wins
    assert rewrite_path("relative/checkpoints", mounts) == "relative/checkpoints"


def test_localize_expands_the_stdlib_placeholder_and_relative_paths():
    base, stdlib = Path("/home/u/jobs"), Path("/usr/lib/python3.11")

    def localized(path):
        job = parse_job(manifest(data={"source": "files", "path": path}), require_image=False)
        return localize(job, base_dir=base, stdlib=stdlib).spec.data.path

    assert localized("{stdlib}/json/*.py") == "/usr/lib/python3.11/json/*.py"
    assert localized("text/*.txt") == "/home/u/jobs/text/*.txt"
    assert localized("/data/*.txt") == "/data/*.txt"
    assert localized("~/corpus/*.txt") == "~/corpus/*.txt"
    untouched = parse_job(manifest(data={"source": "synthetic"}), require_image=False)
    assert localize(untouched, base_dir=base, stdlib=stdlib) == untouched


@pytest.mark.parametrize("init_from, local", [
    # Relative: from the manifest's folder, as data.path (the trainers run in the work directory).
    ("weights/model.safetensors", "/home/u/jobs/weights/model.safetensors"),
    ("../exports/run-1", "/home/u/jobs/../exports/run-1"),
    ("/data/model.safetensors", "/data/model.safetensors"),
    ("~/model.safetensors", "~/model.safetensors"),
    # On the checkpoint claim, as a pod sees it: the claim's local folder.
    ("/checkpoints/export/model.safetensors", str(CLAIM / "export" / "model.safetensors")),
    # In an object store: the trainers read the URI itself.
    ("s3://team-ckpt/run-1/step-00000040", "s3://team-ckpt/run-1/step-00000040"),
])
def test_init_from_is_read_from_where_the_manifest_and_the_claim_are(init_from, local):
    job = parse_job(manifest(model={"initFrom": init_from}), require_image=False)
    localized = localize(job, base_dir=Path("/home/u/jobs"), stdlib=Path("/usr/lib/python3.11"))
    p = plan_local(localized, workdir=WORKDIR, claims=CLAIMS, rendezvous=RENDEZVOUS, metrics_port=41235,
                   python=PYTHON, cpu_count=8)
    assert local_trainer_yaml(p)["model"]["init_from"] == local


def test_the_runners_planner_resolves_a_relative_init_from_against_the_manifests_folder(tmp_path):
    plan_for = planner(manifest(model={"initFrom": "weights"}), base_dir=tmp_path / "jobs", workdir=tmp_path / "run",
                       metrics_port=41235)
    trainer_yaml = yaml.safe_load(plan_for().files[tmp_path / "run" / "config" / "trainer.yaml"])
    assert trainer_yaml["model"]["init_from"] == str(tmp_path / "jobs" / "weights")


def test_process_env_drops_inherited_launch_variables():
    worker = plan().workers[1]
    inherited = {"PATH": "/usr/bin", "HOME": "/home/u", "RANK": "3", "MASTER_PORT": "1", "PET_NNODES": "9", "TORCHELASTIC_RUN_ID": "x"}
    env = process_env(inherited, worker)
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/u"
    assert "RANK" not in env and "MASTER_PORT" not in env and "TORCHELASTIC_RUN_ID" not in env
    assert env["PET_NNODES"] == "2:2"


def test_a_data_claim_without_its_folder_is_unschedulable_as_a_missing_claim_is(tmp_path):
    from brain_operator.local.plan import missing_claim

    manifest = yaml.safe_load((Path(__file__).parents[2] / "deploy/examples/local-tokens.yaml").read_text())
    claims = tmp_path / "claims"
    plan = plan_local(parse_job(manifest, require_image=False), workdir=tmp_path / "work", claims=claims,
                      rendezvous=tmp_path / "r", metrics_port=41235, python=PYTHON, cpu_count=8)
    line = missing_claim(plan, Path.is_dir)
    workers = ", ".join(w.name for w in plan.workers)
    assert line == (f'Unschedulable: worker pods {workers}: persistentvolumeclaim "stdlib-tokens" not found: no folder '
                    f"{claims / 'stdlib-tokens'} (spec.data.volume.claimName: stdlib-tokens; braintrain run --claims)")
    (claims / "stdlib-tokens").mkdir(parents=True)
    assert missing_claim(plan, Path.is_dir) is None


def test_a_worker_whose_agent_cannot_start_is_named_with_the_kubelets_reason(tmp_path):
    from brain_operator.local.plan import LocalWorker, not_started

    worker = LocalWorker("j-worker-1", ["/no/python", "-m", "x"], {}, [], tmp_path / "t")
    line = not_started(worker, FileNotFoundError(2, "No such file or directory"))
    assert line == "RunContainerError: worker pod j-worker-1: /no/python could not be started: No such file or directory"
