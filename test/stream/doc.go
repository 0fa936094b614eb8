// Package stream proves the lifecycle stream's contract (docs/stream.md)
// against real `pleg run` processes on the simulated runtime, from outside
// pleg's code: a Node client built only from @grpc/grpc-js,
// @grpc/proto-loader and the repository's .proto (test/clients/node), a
// real Chromium's EventSource whose connection is dropped, pleg restarted
// under its subscribers, a subscriber that stops reading and 1,000 idle
// subscribers. It has tests only; test/e2e proves the rest on real
// containerd (TestMeasureAgents, TestStreamContainerdRestarted).
//
// Provisioning: the npm packages are installed by `npm ci` from
// test/clients/node/package-lock.json into .cache/node (under a lock,
// once per lock file; the npm registry must be reachable); node and npm
// come with the machine, or from Debian (nodejs, npm) through
// test/apt-install.sh; Chromium likewise (chromium). PLEG_BROWSER_SKIP=1
// skips the browser test.
package stream
