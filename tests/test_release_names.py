"""One set of image names: the chart's defaults, what the release workflow pushes, what the kind script builds and
loads, and what the examples run; the GPU examples name the CUDA build (the trainer's `-cuda` tag)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "brain-operator"
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
E2E = REPO / "deploy" / "kind" / "e2e.sh"
EXAMPLES = REPO / "deploy" / "examples"


def chart_images() -> tuple[str, str, str]:
    """(operator repository, trainer repository, appVersion): what a default `helm install` pulls."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert values["image"]["tag"] == "" and values["trainer"]["image"]["tag"] == "", "the tag is the appVersion"
    return values["image"]["repository"], values["trainer"]["image"]["repository"], app_version


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_the_release_pushes_what_the_chart_pulls_for_both_architectures():
    operator, trainer, _ = chart_images()
    flow = workflow()
    assert flow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    registry = flow["env"]["REGISTRY"]
    [build] = [s for s in flow["jobs"]["images"]["steps"] if s.get("uses", "").startswith("docker/build-push-action")]
    assert build["with"]["tags"] == "${{ env.REGISTRY }}/${{ matrix.image }}:${{ needs.version.outputs.version }}${{ matrix.suffix }}"
    assert set(build["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"} and build["with"]["push"] is True
    pushed = {(m["target"], f"{registry}/{m['image']}", m["flavour"], m["suffix"])
              for m in flow["jobs"]["images"]["strategy"]["matrix"]["include"]}
    assert pushed == {("operator", operator, "cpu", ""), ("trainer", trainer, "cpu", ""), ("trainer", trainer, "cu130", "-cuda")}
    # The version is the tag's, and must be the chart's appVersion; the chart and the CRD go out with it.
    version = "\n".join(s.get("run", "") for s in flow["jobs"]["version"]["steps"])
    assert 'appVersion: \\"$version\\"' in version and "$CHART/Chart.yaml" in version
    chart = "\n".join(s.get("run", "") for s in flow["jobs"]["chart"]["steps"])
    assert 'helm push "brain-operator-$VERSION.tgz" "oci://$REGISTRY/charts"' in chart
    assert 'gh release create "$TAG" "$CRD"' in chart and (REPO / flow["env"]["CRD"]).is_file()


def test_the_kind_script_builds_and_loads_the_charts_images():
    operator, trainer, version = chart_images()
    script = E2E.read_text()
    assert f'TRAINER_IMAGE="{trainer}:{version}"' in script and f'OPERATOR_IMAGE="{operator}:{version}"' in script


def gpus(job: dict) -> bool:
    resources = job["spec"].get("resources") or {}
    return any("nvidia.com/gpu" in (resources.get(kind) or {}) for kind in ("requests", "limits"))


def test_examples_name_the_charts_trainer_and_gpu_examples_its_cuda_build():
    _, trainer, version = chart_images()
    named = 0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for job in yaml.safe_load_all(path.read_text()):
            if not job or job.get("kind") != "BrainTrainingJob" or "image" not in job["spec"]:
                continue
            named += 1
            image = job["spec"]["image"]
            if gpus(job):
                # The published CUDA build, or the same image mirrored into a registry of the cluster's own.
                assert image == f"{trainer}:{version}-cuda" or re.fullmatch(
                    rf"[\w.-]+(/[\w.-]+)*/{trainer.rpartition('/')[2]}:{re.escape(version)}-cuda", image), (path.name, image)
            else:
                assert image == f"{trainer}:{version}", (path.name, image)
    assert named >= 4
