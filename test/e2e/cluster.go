package e2e

// A real Kubernetes cluster on this machine: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler v1.37.2 (built by
// test/kubelet/build.sh's cluster mode), certificates and kubeconfigs
// made here (cluster_pki.go), and nodes that register to it: each a real
// kubelet on a private runtime, in namespaces of its own
// (cluster_net.go). Tests drive it as a user does, with the real kubectl.
//
// Ownership: the control plane's processes run from symlinks in the
// cluster's dir (pleg-e2e-cluster-*), whose owner file names this test
// process, so the next run's sweepStale kills them if this process died
// without tearing down; they also get SIGKILL when it dies
// (Pdeathsig). One cluster runs on a machine at a time (the bridge and
// the API server's address are fixed): clusterLock serializes runs.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/internal/testport"
)

// clusterLock is held by the one cluster of the machine.
const clusterLock = "/run/pleg-e2e-cluster.lock"

// cluster is a running control plane and its nodes.
type cluster struct {
	dir    string // pleg-e2e-cluster-*: pki/, bin/, etcd/, logs
	ca     *clusterCA
	bins   clusterBins
	server string // the API server's URL, as nodes and kubectl reach it
	admin  string // the admin kubeconfig (system:masters)
	procs  []*controlProc
	nodes  []*clusterNode
}

// controlProc is one control-plane process.
type controlProc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (p *controlProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startCluster provisions the control plane's binaries, starts it and
// waits until each component answers; t's cleanup stops it. Failures
// fail t.
func startCluster(t testing.TB) *cluster {
	t.Helper()
	if baseEnv == nil {
		t.Fatal("the e2e harness is not provisioned (run under e2e.Main)")
	}
	start := time.Now()
	bins, err := baseEnv.provisionCluster()
	if err != nil {
		t.Fatalf("provisioning the control plane: %v", err)
	}
	logf("control plane provisioned in %v", time.Since(start).Round(time.Millisecond))
	// The nodes' namespaces are made with ip (iproute2), nsenter and
	// unshare (util-linux, essential on Debian).
	if _, err := exec.LookPath("ip"); err != nil {
		if out, err := exec.Command("bash", filepath.Join(baseEnv.repoRoot, "test", "apt-install.sh"), "iproute2").CombinedOutput(); err != nil {
			t.Fatalf("installing iproute2: %v\n%s", err, out)
		}
	}
	lock, err := os.OpenFile(clusterLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })

	c := &cluster{bins: bins, server: "https://" + clusterServiceIP + ":443"}
	if c.dir, err = os.MkdirTemp("", "pleg-e2e-cluster-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.stop(t) })
	if err := os.WriteFile(filepath.Join(c.dir, ownerFile), []byte(processIdentity(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.setup(); err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	t.Logf("control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.37.2) answering %v after it was provisioned; dir %s",
		time.Since(start).Round(time.Millisecond), c.dir)
	return c
}

func (c *cluster) setup() error {
	for _, d := range []string{"pki", "bin", "etcd", "nodes"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o755); err != nil {
			return err
		}
	}
	bin := map[string]string{}
	for name, src := range map[string]string{
		"etcd": c.bins.Etcd, "kube-apiserver": c.bins.APIServer, "kube-controller-manager": c.bins.ControllerManager,
		"kube-scheduler": c.bins.Scheduler, "kubectl": c.bins.Kubectl,
	} {
		bin[name] = filepath.Join(c.dir, "bin", name)
		if err := os.Symlink(src, bin[name]); err != nil {
			return err
		}
	}
	if err := setupClusterBridge(); err != nil {
		return err
	}
	var err error
	if c.ca, err = newClusterCA(filepath.Join(c.dir, "pki")); err != nil {
		return err
	}
	serving, err := c.ca.issue("apiserver", "kube-apiserver", nil, clusterServiceIP, clusterHostIP, "127.0.0.1",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	if err != nil {
		return err
	}
	_ = serving
	kubeconfigs := map[string]string{}
	for name, subject := range map[string][2]string{
		"admin":              {"pleg-e2e-admin", "system:masters"},
		"controller-manager": {"system:kube-controller-manager", ""},
		"scheduler":          {"system:kube-scheduler", ""},
	} {
		var orgs []string
		if subject[1] != "" {
			orgs = []string{subject[1]}
		}
		cert, err := c.ca.issue(name, subject[0], orgs)
		if err != nil {
			return err
		}
		if kubeconfigs[name], err = c.ca.kubeconfig(name, c.server, cert); err != nil {
			return err
		}
	}
	c.admin = kubeconfigs["admin"]
	saKey, saPub, err := c.ca.serviceAccountKeys()
	if err != nil {
		return err
	}
	ports, release, err := testport.Reserve(4)
	if err != nil {
		return err
	}
	defer release() // each is bound by its process before it is released
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	pki := c.ca.path
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if err := c.startProc(bin["etcd"], "--name=pleg-e2e", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+etcdClient, "--advertise-client-urls="+etcdClient,
		"--listen-peer-urls="+etcdPeer, "--initial-advertise-peer-urls="+etcdPeer,
		"--initial-cluster=pleg-e2e="+etcdPeer, "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "etcd", http.DefaultClient, etcdClient+"/health"); err != nil {
		return err
	}
	if err := c.startProc(bin["kube-apiserver"],
		"--etcd-servers="+etcdClient,
		"--bind-address="+clusterServiceIP, "--secure-port=443", "--advertise-address="+clusterHostIP,
		"--service-cluster-ip-range="+clusterServices,
		"--client-ca-file="+pki("ca.crt"), "--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", "--profiling=false", "--v=2"); err != nil {
		return err
	}
	admin, err := c.client("admin")
	if err != nil {
		return err
	}
	err = c.waitHTTP(ctx, "kube-apiserver", admin, c.server+"/readyz")
	// An idle keep-alive connection would hold the API server's shutdown
	// for its request timeout.
	admin.CloseIdleConnections()
	if err != nil {
		return err
	}
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	cm := kubeconfigs["controller-manager"]
	if err := c.startProc(bin["kube-controller-manager"],
		"--kubeconfig="+cm, "--authentication-kubeconfig="+cm, "--authorization-kubeconfig="+cm,
		"--service-account-private-key-file="+saKey, "--root-ca-file="+pki("ca.crt"),
		"--use-service-account-credentials=true", "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[2]), "--v=2"); err != nil {
		return err
	}
	sch := kubeconfigs["scheduler"]
	if err := c.startProc(bin["kube-scheduler"],
		"--kubeconfig="+sch, "--authentication-kubeconfig="+sch, "--authorization-kubeconfig="+sch,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[3]), "--v=2"); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "kube-controller-manager", insecure, "https://127.0.0.1:"+strconv.Itoa(ports[2])+"/healthz"); err != nil {
		return err
	}
	return c.waitHTTP(ctx, "kube-scheduler", insecure, "https://127.0.0.1:"+strconv.Itoa(ports[3])+"/healthz")
}

// client is an HTTPS client of the API server with kubeconfig name's
// certificate.
func (c *cluster) client(name string) (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(c.ca.path(name+".crt"), c.ca.path(name+".key"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.ca.cert)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}, nil
}

// startProc starts a control-plane process, its output in
// <dir>/<name>.log.
func (c *cluster) startProc(bin string, args ...string) error {
	p := &controlProc{name: filepath.Base(bin), log: filepath.Join(c.dir, filepath.Base(bin)+".log"), done: make(chan struct{})}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = c.dir
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	c.procs = append(c.procs, p)
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return nil
}

// waitHTTP waits until url answers 200, failing early when a process
// exited.
func (c *cluster) waitHTTP(ctx context.Context, what string, client *http.Client, url string) error {
	var last error
	for {
		for _, p := range c.procs {
			if p.exited() {
				return fmt.Errorf("%s exited (%v) while waiting for %s; its log:\n%s", p.name, p.err, what, tailFile(p.log, 30))
			}
		}
		// Each request bounded by the wait's context and 5 s: a process
		// that accepts and never answers must not hold the wait.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
		if err != nil {
			cancel()
			return err
		}
		resp, err := client.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer: %v", what, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tailFile is the last n lines of path.
func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop ends the control plane (the nodes' cleanups ran before: they were
// registered after it) and the cluster's network, and removes its dir.
func (c *cluster) stop(t testing.TB) {
	if t.Failed() {
		logs := map[string]string{}
		for _, p := range c.procs {
			logs[p.name] = p.log
		}
		keepFailedLogs(t, "the control plane's", logs)
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		if p.exited() {
			t.Errorf("%s exited during the test: %v", p.name, p.err)
			continue
		}
		start := time.Now()
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			// Said only when slow: lines after a failure push its
			// message out of what CI's report shows.
			if took := time.Since(start); took > 5*time.Second {
				t.Logf("%s stopped %v after SIGTERM; its log's last lines:\n%s", p.name, took.Round(time.Millisecond), tailFile(p.log, 25))
			}
		case <-time.After(15 * time.Second):
			// kube-apiserver stops listening at once, then waits up to its
			// request timeout (1m) for connections to drain; here they
			// never do, and it exits 54 s to over a minute after SIGTERM
			// (seen in this suite). The cluster's state is discarded: a
			// kill loses nothing.
			p.cmd.Process.Kill()
			<-p.done
			t.Logf("%s had not exited 15s after SIGTERM; killed. Its log's last lines:\n%s", p.name, tailFile(p.log, 8))
		}
	}
	if err := teardownClusterNet(); err != nil {
		t.Errorf("the cluster's network: %v", err)
	}
	if procs := ourProcesses(c.dir, "", -1); len(procs) > 0 {
		t.Errorf("processes of the cluster left: %v", procs)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		t.Errorf("removing %s: %v", c.dir, err)
	}
}

// kubectl runs the real kubectl as the cluster's admin, from the
// repository's root (so that deploy/ paths are as a user types them).
func (c *cluster) kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.dir, "bin", "kubectl"), args...)
	cmd.Dir = baseEnv.repoRoot
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.admin)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// Kubectl is kubectl for a test: an error fails t.
func (c *cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// getJSON runs kubectl get ... -o json into v.
func (c *cluster) getJSON(v any, args ...string) error {
	out, err := c.kubectl(append(append([]string{"get"}, args...), "-o", "json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(out), v)
}

// clusterNode is a node of the cluster: its namespaces, runtime and
// kubelet.
type clusterNode struct {
	name string
	ns   *nodeNS
	k    *kubelet
	dir  string // <cluster dir>/nodes/<name>: pleg-run/ is its /run/pleg
}

// plegRun is the node's /run/pleg, as the host sees it.
func (n *clusterNode) plegRun() string { return filepath.Join(n.dir, "pleg-run") }

// addNode starts node i of the cluster, named name, on runtime item (an
// allRuntimes item), with the OCI archives preload imported into its
// runtime before its kubelet starts, and waits until its kubelet answers;
// t's cleanup stops it (the kubelet, the runtime, the namespaces).
func (c *cluster) addNode(t testing.TB, i int, name, item string, preload []ociArchive) *clusterNode {
	t.Helper()
	requireRuntimeItem(t, item)
	start := time.Now()
	n := &clusterNode{name: name, dir: filepath.Join(c.dir, "nodes", name)}
	if err := os.MkdirAll(n.plegRun(), 0o755); err != nil {
		t.Fatal(err)
	}
	cert, err := c.ca.issue("node-"+name, "system:node:"+name, []string{"system:nodes"})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := c.ca.kubeconfig("node-"+name, c.server, cert)
	if err != nil {
		t.Fatal(err)
	}
	k := newKubelet()
	k.node, k.kubeconfig = name, kubeconfig
	prepare := func(e *env) error {
		binds := []bindMount{{n.plegRun(), "/run/pleg"}}
		var tmpfs []string
		if e.kind == kindCRIO {
			// CRI-O's socket dir is already a dir of its own
			// (e.dir/crio); on a node it is /var/run/crio.
			binds = append(binds, bindMount{filepath.Dir(e.sock), "/run/crio"})
			// See kubelet.start: no huge page sizes on the node.
			tmpfs = append(tmpfs, "/sys/kernel/mm/hugepages")
		} else {
			run := filepath.Join(e.dir, "run")
			e.sock = filepath.Join(run, "containerd.sock")
			e.runDirMade = false // the node's /run/containerd is run/
			binds = append(binds, bindMount{run, "/run/containerd"})
		}
		for _, b := range binds {
			if err := os.MkdirAll(b.source, 0o755); err != nil {
				return err
			}
		}
		ns, err := newNodeNS(i, name, binds, tmpfs)
		if ns != nil {
			n.ns = ns
			e.enter = ns.enter()
		}
		return err
	}
	before := func(e *env) error {
		if e.kind == kindCRIO {
			e.preload = append(e.preload, preload...)
		}
		return nil
	}
	t.Cleanup(func() {
		if n.ns != nil {
			if err := n.ns.remove(); err != nil {
				t.Errorf("node %s: %v", name, err)
			}
		}
	})
	e := k.startRuntime(t, item, envOpts{prepare: prepare, before: before})
	k.ns, k.ip = n.ns, n.ns.ip
	n.k = k
	if e.kind == kindContainerd {
		for _, a := range preload {
			k.ImportImage(t, a.path, a.ref)
		}
	}
	// The Node object first, as an administrator may create it: the
	// kubelet finds it and adopts it. A kubelet that registers itself
	// late has given up initializing its CSINode by then (its retries last
	// about 20 s, each answered "nodes not found") and keeps its Node
	// NotReady for good ("failed to initialize CSINode"). Late it was, by
	// 22 s, on a fresh machine: its cAdvisor scans the host's cgroups
	// before the kubelet registers, and on a machine shared with the e2e
	// suite each container of another CRI-O costs the crio handler 3 s of
	// retries.
	nodeFile := filepath.Join(n.dir, "node.json")
	if err := os.WriteFile(nodeFile, []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":`+strconv.Quote(name)+`}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Kubectl(t, "create", "-f", nodeFile)
	if err := k.start(); err != nil {
		t.Fatalf("node %s: starting the kubelet: %v\n%s", name, err, k.logTail(40))
	}
	k.enablePodNetwork(t)
	c.nodes = append(c.nodes, n)
	t.Logf("node %s (%s, %s) up in %v; kubelet log %s", name, e.name(), n.ns.ip, time.Since(start).Round(time.Millisecond), k.logPath)
	return n
}

// waitFor polls cond every 500 ms until it returns nil or within passes;
// it returns how long it took, and fails t with cond's last error.
func waitFor(t testing.TB, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, within, what, cond)
	return time.Since(start)
}

var errNotYet = errors.New("not yet")

// nodeReachable checks that the host reaches the node's address (the
// bridge works) by its kubelet's healthz port.
func nodeReachable(n *clusterNode) error {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(n.ns.ip, strconv.Itoa(n.k.healthzPort)), 2*time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}
