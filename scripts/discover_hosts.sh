#!/usr/bin/env bash
# Horovod elastic host discovery: prints one `host:slots` line per host that may run workers now.
#
#   horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script scripts/discover_hosts.sh \
#       python -m models.train --elastic ...
#
# Horovod runs this every second. Hosts come from, in this order:
# 1. the file named by SPEECHFLOW_HOSTS_FILE (default: hosts.txt beside this script's caller),
#    `host:slots` lines that you edit to add or remove hosts (blank lines and # comments skipped);
#    on one machine, several names of it (localhost and 127.0.0.1) are several hosts, so a killed
#    worker's host is the only one Horovod stops using;
# 2. on Kubernetes (KUBERNETES_SERVICE_HOST set), the running worker pods of this job, listed
#    through the API with the pod's service account (which may list pods, nothing else: see
#    k8s/elastic/), selected by SPEECHFLOW_WORKER_SELECTOR, each with SPEECHFLOW_SLOTS slots.
set -euo pipefail
hosts_file=${SPEECHFLOW_HOSTS_FILE:-hosts.txt}
if [ -f "$hosts_file" ]; then
  grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$hosts_file"
  exit 0
fi
if [ -n "${KUBERNETES_SERVICE_HOST:-}" ]; then
  exec python3 - <<'PYTHON'
import json, os, ssl, urllib.parse, urllib.request

account = "/var/run/secrets/kubernetes.io/serviceaccount"
namespace = open(f"{account}/namespace").read().strip()
selector = urllib.parse.quote(os.environ["SPEECHFLOW_WORKER_SELECTOR"])
url = (f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
       f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
request = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(f"{account}/token").read().strip()})
context = ssl.create_default_context(cafile=f"{account}/ca.crt")
pods = json.load(urllib.request.urlopen(request, context=context, timeout=5))["items"]
slots = os.environ.get("SPEECHFLOW_SLOTS", "1")
for pod in pods:
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
    if pod["status"].get("phase") == "Running" and ready and pod["status"].get("podIP"):
        print(f"{pod['status']['podIP']}:{slots}")
PYTHON
fi
echo "discover_hosts.sh: no hosts file ($hosts_file) and not on Kubernetes; set SPEECHFLOW_HOSTS_FILE" >&2
exit 1
