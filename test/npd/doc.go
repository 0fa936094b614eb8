// Package npd runs the real node-problem-detector (k8s.io/node-problem-detector
// v1.36.0, built by provision.sh into <repo>/.cache/npd) with the plugin
// config pleg ships, deploy/npd/pleg-plugin-monitor.json, against a real
// `pleg run` relisting a real `pleg simulate` process, and asserts what NPD
// itself reports (its /metrics problem_gauge and problem_counter, and the
// PLEGUnhealthy condition it logs) when the node is healthy, when the
// runtime hangs (the simulator SIGSTOPped), when it recovers (SIGCONT),
// when the pleg daemon is down, and when NPD starts before the pleg binary
// is in place. README.md in this directory tells more.
package npd
