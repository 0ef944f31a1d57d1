"""`braintrain`: run, render, validate and size BrainTrainingJobs; start the operator.

Every command reads the manifest the way the operator does (`spec.parse_job`)
and renders with the operator's own functions, so what `render` prints is
what the cluster gets and what `run` executes locally. `--set PATH=VALUE`
changes a field under `spec` as if the file said so (spec/overrides.py).
Errors are one line each (`FILE: spec.training.steps: must be >= 1, got 0`),
never a traceback; nor is a closed pipe (`braintrain estimate job.yaml | head -1`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from brain_trainer.config import kubeyaml
from brain_trainer.config import read_yaml
from brain_trainer.data.tokens.options import add_arguments as add_prepare_arguments
from brain_trainer.inference.eval_args import add_arguments as add_eval_arguments
from brain_trainer.inference.generate_args import add_arguments as add_generate_arguments
from brain_trainer.model.export_args import add_arguments as add_export_arguments
from brain_trainer.schema import ConfigError, FieldError

from . import __version__
from .local.plan import LocalRunError
from .logs import LOG_FORMATS
from .spec import JOB_BACKENDS, OperatorDefaults, parse_job
from .spec.overrides import apply_overrides, as_flags, attribute, parse_overrides
from .spec.parse import IMAGE_FIELD
from .local.dataset import job_vocabulary
from .sizing.storage import check_storage

__all__ = ["main"]


class CliError(Exception):
    """A problem the user can fix, reported as one line."""


def load_manifest(path: Path) -> dict[str, Any]:
    """The YAML mapping in `path`: CliError when the file is unreadable or not YAML, ConfigError when not a mapping."""
    try:
        data = read_yaml(path)
    except ConfigError as exc:
        raise CliError(str(exc)) from None  # it names the file already
    if not isinstance(data, dict):
        raise ConfigError([FieldError("", f"a BrainTrainingJob must be a mapping, got {type(data).__name__}")])
    return data


def job_manifest(args: argparse.Namespace) -> dict[str, Any]:
    """The manifest in `args.file` with the command line's `--set`s applied."""
    return apply_overrides(load_manifest(args.file), args.overrides)


def _with_backend(manifest: dict[str, Any], backend: Optional[str]) -> dict[str, Any]:
    if backend is None or not isinstance(manifest.get("spec"), dict):
        return manifest
    return {**manifest, "spec": {**manifest["spec"], "backend": backend}}


def cmd_run(args: argparse.Namespace) -> int:
    from .local.run import run_job

    return run_job(job_manifest(args), base_dir=args.file.resolve().parent, workdir=args.workdir, claims=args.claims,
                   defaults=OperatorDefaults.from_env(), overrides=tuple(o.text for o in args.overrides))


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from .local.run import request_checkpoint

    request = request_checkpoint(args.workdir)
    print(f"braintrain: checkpoint requested ({request}): the workers commit one at their next step boundary")
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from brain_trainer.checkpoint.listing import ListingError, list_location

    try:
        print("\n".join(list_location(args.location)))
    except ListingError as exc:
        raise CliError(str(exc)) from None
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from .local.run import request_profile

    if args.steps < 1:
        raise CliError(f"--steps: must be a whole number >= 1, got {args.steps}")
    request = request_profile(args.workdir, args.steps)
    print(f"braintrain: profile requested ({request}): every worker traces {args.steps} step(s) from its next step "
          f"boundary, into profiles/step-<n>/ beside the checkpoints")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from .cluster.worker_logs import Logs, since_seconds

    try:
        since = since_seconds(args.since) if args.since else None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    with _cluster_errors(args.job):
        core, custom, namespace = _cluster(args.namespace)
        logs = Logs(core, custom, namespace, args.job, print, rank=args.rank, since=since)
        if args.follow:
            logs.follow()
        else:
            logs.print_once()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .status.summary import summary_lines
    from .cluster.worker_logs import read_job

    with _cluster_errors(args.job):
        _, custom, namespace = _cluster(args.namespace)
        print("\n".join(summary_lines(read_job(custom, namespace, args.job))))
    return 0


def _cluster(namespace: Optional[str]) -> tuple[Any, Any, str]:
    from .cluster.kube_context import NoCluster, current_cluster

    try:
        return current_cluster(namespace)
    except NoCluster as exc:
        raise CliError(str(exc)) from None


@contextlib.contextmanager
def _cluster_errors(job: str) -> Iterator[None]:
    """The API server's refusals and silences as one line each."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        raise CliError(f"job {job}: the API server answered {exc.status} {exc.reason}") from None
    except HTTPError as exc:
        raise CliError(f"no cluster: the API server does not answer ({type(exc).__name__})") from None


def cmd_render(args: argparse.Namespace) -> int:
    from .backends import render

    manifest = _with_backend(job_manifest(args), args.backend)
    job = parse_job(manifest, defaults=OperatorDefaults.from_env())
    sys.stdout.write(kubeyaml.dump_all(render(job)))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    manifest = job_manifest(args)
    try:
        job = parse_job(manifest, require_image=not args.local, defaults=OperatorDefaults.from_env())
    except ConfigError as exc:
        raise ConfigError([_ways_to_an_image(e) for e in exc.errors]) from None
    check_storage(job, job_vocabulary(job, base_dir=args.file.resolve().parent))
    overridden = f", with {as_flags(o.text for o in args.overrides)}" if args.overrides else ""
    print(f"{args.file}: valid BrainTrainingJob {job.name!r} ({job.spec.nodes} x {job.spec.nproc_per_node} processes"
          f"{overridden})")
    return 0


def _ways_to_an_image(error: FieldError) -> FieldError:
    """A missing image names `--local` too: `braintrain run` needs none, and the shipped local examples name none."""
    if error.path != IMAGE_FIELD:
        return error
    return FieldError(error.path, f"{error.message}, or check the job as `braintrain run` reads it "
                                  "(no image needed): braintrain validate --local")


def cmd_estimate(args: argparse.Namespace) -> int:
    from .sizing.estimate import estimate_lines

    job = parse_job(job_manifest(args), require_image=False, defaults=OperatorDefaults.from_env())
    # A relative data.path is the manifest folder's, as `braintrain run` reads it.
    vocabulary = job_vocabulary(job, base_dir=args.file.resolve().parent)
    print("\n".join(estimate_lines(job, vocabulary, device_memory_gib=args.device_memory)))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    try:  # torch: the trainer's extra, absent from the operator image
        from brain_trainer.hf.export import run
    except ImportError as exc:
        raise CliError(f"export needs the trainer extra (pip install 'brain-train[trainer]'): {exc}") from None
    return run(args)


def cmd_generate(args: argparse.Namespace) -> int:
    try:  # torch: the trainer's extra, absent from the operator image
        from brain_trainer.inference.generate import run
    except ImportError as exc:
        raise CliError(f"generate needs the trainer extra (pip install 'brain-train[trainer]'): {exc}") from None
    return run(args)


def cmd_eval(args: argparse.Namespace) -> int:
    try:  # torch: the trainer's extra, absent from the operator image
        from brain_trainer.inference.evaluate import run
    except ImportError as exc:
        raise CliError(f"eval needs the trainer extra (pip install 'brain-train[trainer]'): {exc}") from None
    return run(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    try:  # torch: the trainer's extra, absent from the operator image
        from brain_trainer.resilience.doctor import doctor
    except ImportError as exc:
        raise CliError(f"doctor needs the trainer extra (pip install 'brain-train[trainer]'): {exc}") from None
    job = parse_job(job_manifest(args), require_image=False, defaults=OperatorDefaults.from_env())
    return doctor(job.spec.distributed, max(2, job.spec.nproc_per_node))


def cmd_operator(args: argparse.Namespace) -> int:
    from kubernetes.config import ConfigException

    from .handlers import run

    if not args.namespace and not args.all_namespaces:
        raise CliError("name the namespaces to watch: --namespace NS (repeatable) or --all-namespaces")
    try:
        run(
            namespaces=args.namespace or (),
            all_namespaces=args.all_namespaces,
            liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz",
            metrics_port=args.metrics_port,
            log_format=args.log_format,
            verbose=args.verbose,
        )
    except ConfigException as exc:  # neither in a pod nor with a kubeconfig
        raise CliError(f"no Kubernetes credentials: {exc}") from None
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    try:  # numpy and tokenizers: the trainer's extra, absent from the operator image
        from brain_trainer.data.tokens.prepare import run
    except ImportError as exc:
        raise CliError(f"prepare needs the trainer extra (pip install 'brain-train[trainer]'): {exc}") from None
    return run(args, prog="braintrain prepare")


Command = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


def _manifest_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, metavar="FILE", help="a BrainTrainingJob manifest (YAML)")
    p.add_argument(
        "--set", action="append", default=[], metavar="PATH=VALUE",
        help="set a field under spec as if the file said so (repeatable): training.steps=10, "
        "checkpoint.intervalSteps=5, scheduling.tolerations[0].key=gpu; VALUE is YAML, as in the manifest",
    )


def _local_run_commands(command: Command) -> None:
    """run, and what a running local job is asked: checkpoint, profile."""
    p = command("run", cmd_run, "train the job locally: one torchrun agent per worker pod, on this machine")
    _manifest_arg(p)
    p.add_argument(
        "--workdir", type=Path, metavar="DIR", help="config, scratch and progress folders (default: ./runs/<job-name>)"
    )
    p.add_argument(
        "--claims",
        type=Path,
        metavar="DIR",
        help="persistent volume claims, one folder each, named after the claim; they outlive the run (default: ./runs/claims)",
    )

    p = command("checkpoint", cmd_checkpoint, "ask a running `braintrain run` for a checkpoint at its next step boundary")
    p.add_argument("workdir", type=Path, metavar="WORKDIR", help="the run's work directory (default of run: ./runs/<job-name>)")

    p = command("profile", cmd_profile, "ask a running `braintrain run` for a profile of the steps after its next "
                "step boundary, on every rank")
    p.add_argument("workdir", type=Path, metavar="WORKDIR", help="the run's work directory (default of run: ./runs/<job-name>)")
    p.add_argument("--steps", type=int, default=3, metavar="N", help="optimizer steps traced (default: 3)")


def _manifest_commands(command: Command) -> None:
    """What a manifest says without running it: render, validate, estimate, doctor."""
    p = command("render", cmd_render, "print the Kubernetes objects the operator creates for the job")
    _manifest_arg(p)
    p.add_argument("--backend", choices=JOB_BACKENDS, help="override spec.backend")

    p = command("validate", cmd_validate, "check the manifest; exit 1 with one line per invalid field")
    _manifest_arg(p)
    p.add_argument("--local", action="store_true", help="as `braintrain run` reads it: no image needed")

    p = command("estimate", cmd_estimate, "per-rank memory of the job and the strategy the planner picks")
    _manifest_arg(p)
    p.add_argument(
        "--device-memory", type=float, metavar="GIB", help="memory per device in GiB (default: 80)"
    )

    p = command("doctor", cmd_doctor, "on this machine: the variables torchrun and NCCL read, the backend, the devices "
                "and the job's preflight (one timed all-reduce and a barrier)")
    _manifest_arg(p)


def _model_commands(command: Command) -> None:
    """Data and models around a run: prepare, checkpoints, export, generate, eval."""
    p = command("prepare", cmd_prepare, "turn a corpus into a token dataset folder for data.source tokens")
    add_prepare_arguments(p)

    p = command("checkpoints", cmd_checkpoints, "list the committed checkpoints of a folder or an s3:// prefix: step, "
                "time, size, world size and layout, the latest marked; what is not committed is named below")
    p.add_argument("location", metavar="LOCATION", help="a checkpoint folder (checkpoint.dir, a claim's folder) or "
                   "s3://bucket/prefix (endpoint and credentials from the environment: AWS_ENDPOINT_URL, ...)")

    p = command("export", cmd_export, "write a checkpoint's model as Hugging Face transformers loads it (safetensors, config, code, tokenizer)")
    add_export_arguments(p)

    p = command("generate", cmd_generate, "continue text with a trained model (a checkpoint or an export), streamed")
    add_generate_arguments(p)

    p = command("eval", cmd_eval, "loss and perplexity of a checkpoint on a prepared dataset's validation split")
    add_eval_arguments(p)


def _cluster_commands(command: Command) -> None:
    """A job in the current cluster: logs, status."""
    p = command("logs", cmd_logs, "print every worker pod's log of a job in the current cluster, each line prefixed "
                "with its pod and node rank")
    p.add_argument("job", metavar="JOB", help="the BrainTrainingJob's name")
    p.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    p.add_argument("-f", "--follow", action="store_true", help="stream the logs, and those of pods that replace "
                   "workers, until the job ends")
    p.add_argument("--rank", type=int, metavar="N", help="only the worker pod of node rank N")
    p.add_argument("--since", metavar="DURATION", help="only lines newer than this (30s, 10m, 1h)")

    p = command("status", cmd_status, "print a job's phase, progress, restarts, incident, last checkpoint and conditions")
    p.add_argument("job", metavar="JOB", help="the BrainTrainingJob's name")
    p.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")



def _operator_command(command: Command) -> None:
    p = command("operator", cmd_operator, "run the BrainTrainingJob operator (kopf) against the current cluster")
    p.add_argument("--namespace", action="append", metavar="NS", help="watch this namespace (repeatable)")
    p.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--liveness-port", type=int, default=8080, help="serve /healthz on this port (default 8080)")
    p.add_argument("--metrics-port", type=int, default=9090, help="serve Prometheus metrics on this port (default 9090)")
    p.add_argument(
        "--log-format", choices=LOG_FORMATS, default="text",
        help="text: timestamped lines, [namespace/name] first; json: one object per line, the job in 'object'",
    )
    p.add_argument("--verbose", action="store_true", help="log at DEBUG instead of INFO")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="braintrain",
        description="Kubernetes-native distributed PyTorch training: one BrainTrainingJob, on a laptop or a cluster.",
    )
    parser.add_argument("--version", action="version", version=f"braintrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(handler=handler)
        return p

    for add in (_local_run_commands, _cluster_commands, _manifest_commands, _model_commands, _operator_command):
        add(command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        args.overrides = parse_overrides(getattr(args, "set", ()))
    except ConfigError as exc:  # the command line's, not the file's
        for error in exc.errors:
            print(f"braintrain: {error}", file=sys.stderr)
        return 1
    try:
        code = args.handler(args)
        # Flushed here, output into a closed pipe fails below, where it is handled, not in the interpreter's exit.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python's advice (signal module, "Note on SIGPIPE"): what is left to write goes nowhere, and the exit code
        # is the one Python gives a write to a closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ConfigError as exc:
        where = getattr(args, "file", None)
        for error in attribute(exc.errors, args.overrides):
            print(f"{where}: {error}" if where else str(error), file=sys.stderr)
        return 1
    except (CliError, LocalRunError) as exc:
        print(f"braintrain: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("braintrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
