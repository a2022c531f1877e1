#!/bin/sh
# Writes the Prometheus Operator's flavour of the alert rules and their tests (deploy/kubernetes/alerts/) from
# the bare-metal files here: the same rules, with the PodMonitors' job names (<namespace>/<name>). A test
# fails while the two flavours differ in anything else. Usage: deploy/prometheus/flavour.sh [NAMESPACE]
set -eu
here=$(dirname "$0")
ns=${1:-watchd}
for f in watchd-alerts.yaml watchd-alerts.test.yaml; do
  sed -E "s#(job=~?\"|job: )watchd-(engine|agent)#\\1${ns}/watchd-\\2#g" "$here/$f" >"$here/../kubernetes/alerts/$f"
done
