#!/usr/bin/env bash
# End to end on kind: create a cluster, build and load both images, install the
# chart, run deploy/examples/cpu-gloo.yaml and wait until it has Succeeded.
#
#   make kind-e2e                # run it (needs docker, kind, kubectl, helm)
#   make kind-e2e DRY_RUN=1      # print every step, run nothing
#   make kind-e2e TEARDOWN=1     # delete the cluster when done, pass or fail
#
# CLUSTER and TIMEOUT override the cluster name and the wait. The images are
# built (with docker, which kind loads from) under the names the chart's
# defaults and the release use, ghcr.io/brain-ai/brain-train-*:<appVersion>,
# which the example job names too (tests/test_release_names.py).
set -euo pipefail

# The script's folder without `dirname`: the tool check must work on a bare PATH.
HERE="${BASH_SOURCE[0]%/*}"
[[ "${HERE}" != "${BASH_SOURCE[0]}" ]] || HERE="."
ROOT="$(cd "${HERE}/../.." && pwd)"
CLUSTER="${CLUSTER:-brain-e2e}"
TIMEOUT="${TIMEOUT:-15m}"
DRY_RUN="${DRY_RUN:-0}"
TEARDOWN="${TEARDOWN:-0}"
TRAINER_IMAGE="ghcr.io/brain-ai/brain-train-trainer:0.1.0"
OPERATOR_IMAGE="ghcr.io/brain-ai/brain-train-operator:0.1.0"
RELEASE="brain-operator"
OPERATOR_NAMESPACE="brain-system"
JOB_NAMESPACE="brain-jobs"
JOB_FILE="${ROOT}/deploy/examples/cpu-gloo.yaml"
REQUIRED_TOOLS=(docker kind kubectl helm)

enabled() { [[ "$1" != "" && "$1" != "0" && "$1" != "false" ]]; }

# Print a command the way a shell would read it back, then run it unless dry.
run() {
    local arg line="+"
    for arg in "$@"; do
        if [[ "${arg}" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
            line+=" ${arg}"
        else
            line+=" '${arg}'"
        fi
    done
    printf '%s\n' "${line}"
    if ! enabled "${DRY_RUN}"; then
        "$@"
    fi
}

step() { printf '\n==> %s\n' "$*"; }

check_tools() {
    local tool missing=()
    for tool in "${REQUIRED_TOOLS[@]}"; do
        if ! command -v "${tool}" >/dev/null 2>&1; then
            missing+=("${tool}")
        fi
    done
    if ((${#missing[@]} == 0)); then
        printf 'found: %s\n' "${REQUIRED_TOOLS[*]}"
        if ! enabled "${DRY_RUN}" && ! docker info >/dev/null 2>&1; then
            printf 'docker is installed but its daemon is not reachable: start it and run again\n' >&2
            return 1
        fi
        return 0
    fi
    for tool in "${missing[@]}"; do
        printf 'missing required tool: %s\n' "${tool}" >&2
    done
    if enabled "${DRY_RUN}"; then
        printf 'dry run: continuing without them\n'
        return 0
    fi
    printf 'install %s and run again (make kind-e2e DRY_RUN=1 shows the plan)\n' "${missing[*]}" >&2
    return 1
}

# On failure, everything needed to see why: the job, its pods, their logs, the operator's logs.
report_failure() {
    printf '\nkind-e2e: the job did not reach Succeeded; its status and logs follow\n' >&2
    local job
    job="$(kubectl get --namespace "${JOB_NAMESPACE}" --filename "${JOB_FILE}" --output 'jsonpath={.metadata.name}')" || true
    kubectl get --namespace "${JOB_NAMESPACE}" --filename "${JOB_FILE}" --output yaml || true
    kubectl describe --namespace "${JOB_NAMESPACE}" --filename "${JOB_FILE}" || true
    if [[ -n "${job}" ]]; then
        kubectl get pods --namespace "${JOB_NAMESPACE}" --selector "brain.ai/job-name=${job}" --output wide || true
        kubectl logs --namespace "${JOB_NAMESPACE}" --selector "brain.ai/job-name=${job}" \
            --all-containers --prefix --tail 200 || true
    fi
    kubectl logs --namespace "${OPERATOR_NAMESPACE}" "deployment/${RELEASE}" --tail 200 || true
}

teardown() {
    step "Teardown: delete kind cluster ${CLUSTER}"
    run kind delete cluster --name "${CLUSTER}"
}

main() {
    if enabled "${DRY_RUN}"; then
        printf 'kind-e2e dry run: printing each step without running it\n'
    fi

    step "Check tools: ${REQUIRED_TOOLS[*]}"
    check_tools

    if enabled "${TEARDOWN}"; then
        trap teardown EXIT
    fi

    step "Create kind cluster ${CLUSTER}"
    if ! enabled "${DRY_RUN}" && kind get clusters | grep --quiet --line-regexp "${CLUSTER}"; then
        printf 'cluster %s exists; reusing it\n' "${CLUSTER}"
    else
        run kind create cluster --name "${CLUSTER}" --config "${ROOT}/deploy/kind/cluster.yaml" --wait 5m
    fi

    step "Build images ${TRAINER_IMAGE} and ${OPERATOR_IMAGE}"
    run make --directory "${ROOT}" images "TRAINER_IMAGE=${TRAINER_IMAGE}" "OPERATOR_IMAGE=${OPERATOR_IMAGE}" ENGINE=docker

    step "Load images into kind"
    run kind load docker-image --name "${CLUSTER}" "${TRAINER_IMAGE}" "${OPERATOR_IMAGE}"

    step "Create namespaces that enforce the restricted Pod Security Standard"
    run kubectl apply --filename "${ROOT}/deploy/kind/namespaces.yaml"

    step "Install the chart"
    run helm upgrade --install "${RELEASE}" "${ROOT}/charts/brain-operator" \
        --namespace "${OPERATOR_NAMESPACE}" \
        --set "image.repository=${OPERATOR_IMAGE%:*}" --set "image.tag=${OPERATOR_IMAGE##*:}" \
        --set "trainer.image.repository=${TRAINER_IMAGE%:*}" --set "trainer.image.tag=${TRAINER_IMAGE##*:}" \
        --set trainer.imagePullPolicy=IfNotPresent \
        --set rbac.clusterWide=false --set "watchNamespaces={${JOB_NAMESPACE}}" \
        --wait --timeout 5m

    step "helm test: the operator answers on /healthz"
    run helm test "${RELEASE}" --namespace "${OPERATOR_NAMESPACE}" --timeout 2m

    step "Apply the CPU/gloo example job"
    run kubectl apply --namespace "${JOB_NAMESPACE}" --filename "${JOB_FILE}"

    step "Wait for phase Succeeded (up to ${TIMEOUT})"
    if ! run kubectl wait --namespace "${JOB_NAMESPACE}" --filename "${JOB_FILE}" \
        --for 'jsonpath={.status.phase}=Succeeded' --timeout "${TIMEOUT}"; then
        report_failure
        return 1
    fi

    step "Result"
    run kubectl get --namespace "${JOB_NAMESPACE}" --filename "${JOB_FILE}" --output wide
    printf '\nkind-e2e: %s\n' "$(enabled "${DRY_RUN}" && echo 'dry run complete' || echo 'job Succeeded')"
}

main "$@"
