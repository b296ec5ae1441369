// Package check holds the tests of the files that ship beside package
// ceilingprom: the Prometheus alerting rules (alerts.yml) and the Grafana
// dashboard (dashboard.json). They load both with Prometheus' own rule-file
// and PromQL code, check every metric they name against what the exporter
// exports, and evaluate the alerts and the panels' queries on what the
// exporter reported through a simulated outage.
//
// It is a module of its own so that Prometheus' server code, which those
// tests need, is never a requirement of ceilingprom's users: a test-only
// requirement of the ceilingprom module would still take part in their
// builds' version selection.
package check
