"""spec.data.volume: the data's claim (or a pod overlay volume) mounted read-only, on both backends and on a laptop."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_examples import _checked_objects

from brain_operator.cli import main
from brain_operator.local.plan import plan_local
from brain_operator.backends import render
from brain_operator.spec import ConfigError, parse_job

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-tokens.yaml"
CLAIM_MOUNT = {"name": "training-data", "mountPath": "/data", "readOnly": True}
# A prepared token dataset in an object store (spec.data.uri), and how the workers reach the store.
DATA_URI = {"source": "tokens", "uri": "s3://datasets/stdlib-tokens"}
STORE = {"endpoint": "http://minio.storage:9000", "credentialsSecret": "minio-keys"}
NFS = {"name": "corpus", "nfs": {"server": "nfs.example", "path": "/exports/corpus", "readOnly": True}}


def manifest(data=None, **spec):
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"].update(image="registry.example/trainer:1.0", **spec)
    if data is not None:
        job["spec"]["data"] = data
        if data["source"] != "tokens":  # evaluation reads a token dataset's validation split
            del job["spec"]["training"]["evalInterval"]
    return job


def pod_specs(objects):
    """Each worker pod spec: the elastic pods', or the PyTorchJob's replica templates'."""
    for obj in objects:
        if obj["kind"] == "Pod":
            yield obj["spec"]
        elif obj["kind"] == "PyTorchJob":
            yield from (r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values())


def trainer_of(spec):
    return spec["containers"][0]


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_render_shows_the_claim_mounted_read_only(backend, tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest()))
    assert main(["render", str(path), "--backend", backend]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    specs = list(pod_specs(objects))
    assert specs
    for spec in specs:
        assert {"name": "training-data", "persistentVolumeClaim": {"claimName": "stdlib-tokens", "readOnly": True}} in spec["volumes"]
        assert CLAIM_MOUNT in trainer_of(spec)["volumeMounts"]
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["trainer.yaml"])
    assert config["data"] == {"source": "tokens", "path": "/data/stdlib", "num_workers": 0, "num_samples": 65536}, \
        "the trainer reads the path; the volume is the operator's"


@pytest.mark.parametrize("version", ["1.29", "1.37"])
@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_rendered_data_volumes_pass_strict_kubernetes_schemas(backend, version):
    overlay_volume = manifest({"source": "tokens", "path": "/corpus/ds", "volume": {"volume": "corpus", "mountPath": "/corpus"}},
                              podTemplate={"spec": {"volumes": [NFS]}})
    in_store = manifest(DATA_URI, objectStore=STORE, checkpoint={"uri": "s3://checkpoints/local-tokens"})
    for job in (manifest(), overlay_volume, in_store):
        job["spec"]["backend"] = backend
        for obj in render(parse_job(job)):
            for checked in _checked_objects(obj):
                assert kubernetes_validate.validate(checked, version, strict=True) == version


def test_a_pod_overlay_volume_is_mounted_not_added_twice():
    job = parse_job(manifest({"source": "files", "path": "/corpus/**/*.txt", "volume": {"volume": "corpus", "mountPath": "/corpus"}},
                             podTemplate={"spec": {"volumes": [NFS]}}))
    for spec in pod_specs(render(job)):
        assert [v["name"] for v in spec["volumes"]].count("corpus") == 1
        assert {"name": "corpus", "mountPath": "/corpus", "readOnly": True} in trainer_of(spec)["volumeMounts"]
        assert "training-data" not in [v["name"] for v in spec["volumes"]]


def test_no_data_volume_renders_none():
    job = parse_job(manifest({"source": "synthetic"}))
    for spec in pod_specs(render(job)):
        assert [m["mountPath"] for m in trainer_of(spec)["volumeMounts"]] == ["/etc/brain", "/dev/shm", "/checkpoints"]


@pytest.mark.parametrize("backend", ["elastic", "pytorchjob"])
def test_a_data_uri_mounts_no_volume_and_is_the_trainers_path(backend):
    objects = render(parse_job(manifest(DATA_URI, backend=backend, objectStore=STORE)))
    specs = list(pod_specs(objects))
    assert specs
    for spec in specs:
        assert "training-data" not in [v["name"] for v in spec["volumes"]]
        assert [m["mountPath"] for m in trainer_of(spec)["volumeMounts"]] == ["/etc/brain", "/dev/shm", "/checkpoints"]
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["trainer.yaml"])
    assert config["data"]["path"] == "s3://datasets/stdlib-tokens", "the trainer reads the URI as its data.path"


def errors(data=None, **spec):
    with pytest.raises(ConfigError) as exc:
        parse_job(manifest(data, **spec))
    return [str(e) for e in exc.value.errors]


def test_bad_data_volumes_name_the_field():
    tokens = {"source": "tokens", "path": "/data/ds"}
    assert errors({**tokens, "volume": {"mountPath": "/data"}}) == [
        "spec.data.volume.claimName: set either claimName or volume"]
    assert errors({**tokens, "volume": {"claimName": "c", "volume": "v"}}) == [
        "spec.data.volume.claimName: set either claimName or volume"]
    assert errors({**tokens, "volume": {"volume": "nfs"}}) == [
        "spec.data.volume.volume: 'nfs' names no volume of podTemplate.spec.volumes"]
    assert errors({"source": "tokens", "path": "/elsewhere/ds", "volume": {"claimName": "c"}}) == [
        "spec.data.path: must be volume.mountPath (/data) or lie below it, got '/elsewhere/ds'"]
    parse_job(manifest({"source": "tokens", "path": "/data", "volume": {"claimName": "c"}}))  # the claim holds the dataset itself
    assert errors({"source": "tokens", "path": "/etc/brain/ds", "volume": {"claimName": "c", "mountPath": "/etc/brain"}}) == [
        "spec.data.volume.mountPath: must not be '/etc/brain' (used by the pod itself)"]
    assert errors({"source": "tokens", "path": "/checkpoints/data/ds",
                   "volume": {"claimName": "c", "mountPath": "/checkpoints/data"}}) == [
        "spec.data.volume.mountPath: must not overlap checkpoint.mountPath (/checkpoints)"]
    assert errors({**tokens, "volume": {"claimName": "Not_A_Name"}})[0].startswith("spec.data.volume.claimName: must match")
    trainer_mount = {"spec": {"volumes": [NFS], "containers": [
        {"name": "trainer", "volumeMounts": [{"name": "corpus", "mountPath": "/data/extra"}]}]}}
    assert errors({**tokens, "volume": {"claimName": "c"}}, podTemplate=trainer_mount) == [
        "spec.podTemplate.spec.containers[0].volumeMounts[0].mountPath: '/data/extra' is the trainer's own mount "
        "(the trainer config, shared memory, checkpoints or data)"]


def test_bad_data_uris_name_the_field():
    assert errors({**DATA_URI, "uri": "gs://datasets/ds"}) == [
        "spec.data.uri: scheme 'gs' is not supported: only s3:// (Amazon S3 and S3-compatible stores: MinIO, Ceph, "
        "R2), got 'gs://datasets/ds'"]
    assert errors({**DATA_URI, "path": "/data/ds"}) == ["spec.data.uri: set either uri or path, not both"]
    assert errors({**DATA_URI, "volume": {"claimName": "c"}}) == ["spec.data.uri: set either uri or volume, not both"]
    assert errors({**DATA_URI, "source": "files"}) == [
        "spec.data.uri: applies to source tokens (a folder braintrain prepare made), got 'files'"]
    assert errors({"source": "tokens", "path": "s3://datasets/ds"}) == [
        "spec.data.path: a URI goes in uri, got 's3://datasets/ds'"]
    # The checkpoint mount is no volume of a job whose checkpoints are in a store: the data may go there.
    parse_job(manifest({"source": "tokens", "path": "/checkpoints/ds", "volume": {"claimName": "c", "mountPath": "/checkpoints"}},
                       checkpoint={"uri": "s3://checkpoints/run"}))


def test_braintrain_run_reads_the_data_claim_from_its_local_folder(tmp_path):
    job = parse_job(manifest(), require_image=False)
    claims = tmp_path / "claims"
    plan = plan_local(job, workdir=tmp_path / "work", claims=claims, rendezvous=tmp_path / "work" / "rendezvous" / "r",
                      metrics_port=2, python="python", cpu_count=2)
    config = yaml.safe_load(plan.files[tmp_path / "work" / "config" / "trainer.yaml"])
    assert config["data"]["path"] == str(claims / "stdlib-tokens" / "stdlib")
    assert claims / "stdlib-tokens" in plan.dirs
    overlay = parse_job(manifest({"source": "tokens", "path": "/corpus/ds", "volume": {"volume": "corpus", "mountPath": "/corpus"}},
                                 podTemplate={"spec": {"volumes": [NFS]}}), require_image=False)
    plan = plan_local(overlay, workdir=tmp_path / "work", claims=claims,
                      rendezvous=tmp_path / "work" / "rendezvous" / "r", metrics_port=2, python="python", cpu_count=2)
    config = yaml.safe_load(plan.files[tmp_path / "work" / "config" / "trainer.yaml"])
    assert config["data"]["path"] == str(tmp_path / "work" / "volumes" / "corpus" / "ds")


def test_braintrain_run_passes_a_data_uri_through(tmp_path):
    job = parse_job(manifest(DATA_URI, objectStore=STORE), require_image=False)
    plan = plan_local(job, workdir=tmp_path / "work", claims=tmp_path / "claims",
                      rendezvous=tmp_path / "work" / "rendezvous" / "r", metrics_port=2, python="python", cpu_count=2)
    config = yaml.safe_load(plan.files[tmp_path / "work" / "config" / "trainer.yaml"])
    assert config["data"]["path"] == "s3://datasets/stdlib-tokens"
    assert plan.data_claim is None  # no claim folder that must exist
