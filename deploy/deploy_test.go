// Package deploy holds the files that run pleg in a cluster: the DaemonSet
// (kubernetes/), Prometheus rules and a ServiceMonitor (prometheus/), a
// Grafana dashboard (grafana/), node-problem-detector's plugin config
// (npd/) and the image's Dockerfile. Its tests check that every file parses
// as what it claims to be, that the pieces agree with each other (ports,
// paths, names), and that every metric the rules and the dashboard use is
// one pleg exports.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/podlifecycle/pleg/metrics"
)

// ---- what pleg exports -------------------------------------------------------

// metricInfo is one series name pleg exports and its label names.
type metricInfo struct {
	labels []string
}

// exported returns every series name pleg's metrics package exports
// (histograms as _bucket, _sum and _count too) with its labels.
func exported(t *testing.T) map[string]metricInfo {
	t.Helper()
	m := metrics.New(nil)
	v := reflect.ValueOf(m).Elem()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	varLabels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	out := map[string]metricInfo{}
	for i := 0; i < v.NumField(); i++ {
		if !v.Type().Field(i).IsExported() {
			continue
		}
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		_, hist := v.Field(i).Interface().(prometheus.Histogram)
		if _, ok := v.Field(i).Interface().(*prometheus.HistogramVec); ok {
			hist = true
		}
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			s := d.String()
			n := fqName.FindStringSubmatch(s)
			if n == nil {
				t.Fatalf("cannot read the name of %s", s)
			}
			var labels []string
			if l := varLabels.FindStringSubmatch(s); l != nil && strings.TrimSpace(l[1]) != "" {
				for _, x := range strings.Split(l[1], ",") {
					labels = append(labels, strings.Trim(strings.TrimSpace(x), `"`))
				}
			}
			out[n[1]] = metricInfo{labels: labels}
			if hist {
				out[n[1]+"_bucket"] = metricInfo{labels: append(slices.Clone(labels), "le")}
				out[n[1]+"_sum"] = metricInfo{labels: labels}
				out[n[1]+"_count"] = metricInfo{labels: labels}
			}
		}
	}
	for _, must := range []string{"kubelet_node_name", "kubelet_pleg_relist_duration_seconds_bucket",
		"pleg_relist_in_progress_seconds", "pleg_pod_inspection_timeouts_total"} {
		if _, ok := out[must]; !ok {
			t.Fatalf("the metrics package does not export %s (found %d names)", must, len(out))
		}
	}
	return out
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"job", "instance", "cluster"}

// checkExpr parses a PromQL expression and checks that every selector names
// an exported metric (or one of extra) and matches only labels it has.
func checkExpr(t *testing.T, where, expr string, known map[string]metricInfo, extra map[string][]string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v\n%s", where, err, expr)
		return nil
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			t.Errorf("%s: a selector without a metric name: %s", where, vs)
			return nil
		}
		names = append(names, name)
		var labels []string
		if info, ok := known[name]; ok {
			labels = info.labels
		} else if l, ok := extra[name]; ok {
			labels = l
		} else {
			t.Errorf("%s: metric %s is not one pleg exports", where, name)
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel || slices.Contains(targetLabels, m.Name) || slices.Contains(labels, m.Name) {
				continue
			}
			t.Errorf("%s: %s has no label %q (it has %v)", where, name, m.Name, labels)
		}
		return nil
	})
	return names
}

// ---- Kubernetes manifests ----------------------------------------------------

type object = map[string]any

// decodeYAML decodes every document of a YAML file.
func decodeYAML(t *testing.T, path string) []object {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []object
	for {
		var doc object
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	return docs
}

// at walks a path of keys and indexes ("spec.template.spec.containers.0").
func at(t *testing.T, v any, path string) any {
	t.Helper()
	cur := v
	for _, k := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case map[string]any:
			next, ok := c[k]
			if !ok {
				t.Fatalf("no %q (in %s)", k, path)
			}
			cur = next
		case []any:
			var i int
			if _, err := fmt.Sscan(k, &i); err != nil || i >= len(c) {
				t.Fatalf("no index %q (in %s)", k, path)
			}
			cur = c[i]
		default:
			t.Fatalf("cannot descend into %T at %q (in %s)", cur, k, path)
		}
	}
	return cur
}

func str(t *testing.T, v any, path string) string {
	t.Helper()
	s, ok := at(t, v, path).(string)
	if !ok {
		t.Fatalf("%s is %T, not a string", path, at(t, v, path))
	}
	return s
}

func num(t *testing.T, v any, path string) int {
	t.Helper()
	n, ok := at(t, v, path).(int)
	if !ok {
		t.Fatalf("%s is %T, not an integer", path, at(t, v, path))
	}
	return n
}

func list(t *testing.T, v any, path string) []any {
	t.Helper()
	l, ok := at(t, v, path).([]any)
	if !ok {
		t.Fatalf("%s is %T, not a list", path, at(t, v, path))
	}
	return l
}

// flagValue returns the value of --name=value in args.
func flagValue(args []any, name string) (string, bool) {
	for _, a := range args {
		if s, ok := a.(string); ok {
			if v, ok := strings.CutPrefix(s, "--"+name+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

func TestDaemonSet(t *testing.T) {
	docs := decodeYAML(t, "kubernetes/pleg.yaml")
	byKind := map[string]object{}
	for _, d := range docs {
		kind := str(t, d, "kind")
		if _, dup := byKind[kind]; dup {
			t.Errorf("two %s objects", kind)
		}
		byKind[kind] = d
		if kind != "Namespace" && str(t, d, "metadata.namespace") != "pleg-system" {
			t.Errorf("%s is not in the pleg-system namespace", kind)
		}
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "DaemonSet", "Service"} {
		if byKind[kind] == nil {
			t.Fatalf("no %s in kubernetes/pleg.yaml (kinds: %v)", kind, slices.Sorted(maps.Keys(byKind)))
		}
	}
	if str(t, byKind["Namespace"], "metadata.name") != "pleg-system" {
		t.Error("the Namespace is not pleg-system")
	}

	ds := byKind["DaemonSet"]
	if str(t, ds, "apiVersion") != "apps/v1" {
		t.Errorf("DaemonSet apiVersion %q", str(t, ds, "apiVersion"))
	}
	pod := at(t, ds, "spec.template")
	sel := at(t, ds, "spec.selector.matchLabels").(object)
	podLabels := at(t, pod, "metadata.labels").(object)
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("the selector %s=%v does not match the pod labels %v", k, v, podLabels)
		}
	}
	if at(t, pod, "spec.hostNetwork") != true {
		t.Error("the pod does not use the host's network (NPD's check reaches it on 127.0.0.1)")
	}
	if str(t, pod, "spec.serviceAccountName") != str(t, byKind["ServiceAccount"], "metadata.name") {
		t.Error("the pod's service account is not the one defined")
	}
	containers := list(t, pod, "spec.containers")
	if len(containers) != 1 {
		t.Fatalf("%d containers, want 1", len(containers))
	}
	c := containers[0]
	cmd := list(t, c, "command")
	if len(cmd) != 1 || cmd[0] != "/usr/local/bin/pleg" {
		t.Errorf("command %v, want the binary the Dockerfile installs", cmd)
	}
	args := list(t, c, "args")
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("args %v do not start with run", args)
	}

	// The runtime socket: its directory is mounted (hostPath of type
	// Directory, at the same path), and --container-runtime-endpoint names
	// the socket inside it. A mount of the socket file itself would pin
	// the socket the runtime had when the pod started: the runtime
	// recreates it at each start, and pleg could never reconnect.
	endpoint, ok := flagValue(args, "container-runtime-endpoint")
	if !ok {
		t.Fatal("no --container-runtime-endpoint")
	}
	sock, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok || !path.IsAbs(sock) || path.Clean(sock) != sock {
		t.Fatalf("--container-runtime-endpoint %q is not unix:// and an absolute path", endpoint)
	}
	var mount object
	for _, m := range list(t, c, "volumeMounts") {
		mp := str(t, m, "mountPath")
		if mp == sock {
			t.Errorf("the socket file %s itself is mounted: the mount keeps the socket the runtime had when the pod started, and the runtime recreates it at each start", sock)
		}
		if strings.HasPrefix(sock, strings.TrimSuffix(mp, "/")+"/") && (mount == nil || len(mp) > len(str(t, mount, "mountPath"))) {
			mount = m.(object)
		}
	}
	if mount == nil {
		t.Fatalf("no directory holding %s is mounted", sock)
	}
	dir := str(t, mount, "mountPath")
	if dir != path.Dir(sock) {
		t.Errorf("%s is mounted for the socket %s: mount the socket's own directory, %s", dir, sock, path.Dir(sock))
	}
	// readOnly keeps pleg from writing in the runtime's directory (pleg
	// writes nothing there). It restricts nothing about the socket: the
	// kernel does not apply read-only mounts to connect().
	if mount["readOnly"] != true {
		t.Errorf("the runtime's directory %s is mounted writable; pleg writes nothing there", dir)
	}
	var vol object
	for _, v := range list(t, pod, "spec.volumes") {
		if str(t, v, "name") == mount["name"] {
			vol = v.(object)
		}
	}
	if vol == nil {
		t.Fatalf("no volume %v", mount["name"])
	}
	if str(t, vol, "hostPath.type") != "Directory" || str(t, vol, "hostPath.path") != dir {
		t.Errorf("volume %v is not the host's directory %s (hostPath of type Directory)", vol, dir)
	}

	// The pod API (names, IPs, errors, no authentication) stays on the
	// node's loopback; the node's addresses get only what probes and
	// Prometheus need, on --metrics-address.
	listen, ok := flagValue(args, "listen-address")
	if !ok {
		t.Fatal("no --listen-address: the default is loopback, but say it")
	}
	if host, _, err := net.SplitHostPort(listen); err != nil || !net.ParseIP(host).IsLoopback() {
		t.Errorf("--listen-address %q serves the pod API beyond the node's loopback", listen)
	}
	metricsAddr, ok := flagValue(args, "metrics-address")
	if !ok {
		t.Fatal("no --metrics-address: nothing for Prometheus and the probes on the node's address")
	}
	_, port, _ := net.SplitHostPort(metricsAddr)
	// One port everywhere else: the container port, the probes, the scrape
	// annotations and the Service.
	ports := list(t, c, "ports")
	if len(ports) != 1 || fmt.Sprint(num(t, ports[0], "containerPort")) != port {
		t.Errorf("container ports %v, want only %s", ports, port)
	}
	portName := str(t, ports[0], "name")
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := str(t, c, probe+".httpGet.path"); got != path {
			t.Errorf("%s path %q, want %q", probe, got, path)
		}
		if got := at(t, c, probe+".httpGet.port"); got != portName && fmt.Sprint(got) != port {
			t.Errorf("%s port %v, want %s", probe, got, port)
		}
	}
	ann := at(t, pod, "metadata.annotations").(object)
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != port || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", ann)
	}
	if node, ok := flagValue(args, "node-name"); !ok || node != "$(NODE_NAME)" {
		t.Errorf("--node-name %q", node)
	}
	env := list(t, c, "env")
	if str(t, env[0], "name") != "NODE_NAME" || str(t, env[0], "valueFrom.fieldRef.fieldPath") != "spec.nodeName" {
		t.Errorf("env %v does not give NODE_NAME the node's name", env)
	}

	svc := byKind["Service"]
	if at(t, svc, "spec.publishNotReadyAddresses") != true {
		t.Error("the Service drops not-ready pods: their metrics matter most")
	}
	for k, v := range at(t, svc, "spec.selector").(object) {
		if podLabels[k] != v {
			t.Errorf("the Service selector %s=%v does not match the pods", k, v)
		}
	}
	sp := list(t, svc, "spec.ports")[0]
	if fmt.Sprint(num(t, sp, "port")) != port || (at(t, sp, "targetPort") != portName && fmt.Sprint(at(t, sp, "targetPort")) != port) {
		t.Errorf("Service port %v", sp)
	}

	// The ServiceMonitor scrapes that Service's port; its job is "pleg".
	sm := decodeYAML(t, "prometheus/servicemonitor.yaml")
	if len(sm) != 1 || str(t, sm[0], "kind") != "ServiceMonitor" {
		t.Fatalf("servicemonitor.yaml: %v", sm)
	}
	if str(t, sm[0], "spec.endpoints.0.port") != str(t, sp, "name") || str(t, sm[0], "spec.endpoints.0.path") != "/metrics" {
		t.Error("the ServiceMonitor does not scrape the Service's port")
	}
	jobLabel := str(t, sm[0], "spec.jobLabel")
	if at(t, svc, "metadata.labels").(object)[jobLabel] != "pleg" {
		t.Errorf("the ServiceMonitor's job label %q is not pleg on the Service", jobLabel)
	}
}

// ---- Prometheus rules --------------------------------------------------------

type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Record        string            `yaml:"record"`
	Alert         string            `yaml:"alert"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

// templateDefs are the variables Prometheus defines for alert templates.
const templateDefs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"

// templateFuncs stands for the functions Prometheus offers to alert
// templates, so that the templates parse.
var templateFuncs = template.FuncMap{}

func init() {
	for _, name := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage",
		"humanizeTimestamp", "title", "toUpper", "toLower", "match", "reReplaceAll", "first", "label",
		"value", "query", "args", "safeHtml", "graphLink", "tableLink", "externalURL", "pathPrefix",
		"stripPort", "stripDomain", "parseDuration", "sortByLabel", "strvalue", "toTime", "toDuration", "now"} {
		templateFuncs[name] = func(...any) any { return nil }
	}
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile("prometheus/pleg-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("pleg-rules.yaml: %v", err)
	}
	return rf
}

func TestPrometheusRules(t *testing.T) {
	known := exported(t)
	rf := loadRules(t)
	if len(rf.Groups) == 0 {
		t.Fatal("no rule groups")
	}
	recordName := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	alertName := regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	labelName := regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

	// Recorded series are known to the rules after them, with their labels;
	// so is up, Prometheus's own series for each target (its labels are
	// the target's).
	recorded := map[string][]string{"up": nil}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = append(recorded[r.Record], "node", "quantile")
			}
		}
	}

	groups := map[string]bool{}
	alerts := map[string]rule{}
	for _, g := range rf.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group name %q empty or repeated", g.Name)
		}
		groups[g.Name] = true
		if g.Interval != "" {
			if _, err := model.ParseDuration(g.Interval); err != nil {
				t.Errorf("group %s: interval: %v", g.Name, err)
			}
		}
		for i, r := range g.Rules {
			where := fmt.Sprintf("%s rule %d (%s%s)", g.Name, i, r.Record, r.Alert)
			switch {
			case (r.Record == "") == (r.Alert == ""):
				t.Errorf("%s: needs exactly one of record and alert", where)
				continue
			case r.Record != "" && !recordName.MatchString(r.Record):
				t.Errorf("%s: bad record name", where)
			case r.Alert != "" && !alertName.MatchString(r.Alert):
				t.Errorf("%s: bad alert name", where)
			case r.Record != "" && (r.For != "" || r.Annotations != nil):
				t.Errorf("%s: a recording rule has no for or annotations", where)
			}
			for _, d := range []string{r.For, r.KeepFiringFor} {
				if d != "" {
					if _, err := model.ParseDuration(d); err != nil {
						t.Errorf("%s: %v", where, err)
					}
				}
			}
			for k, v := range r.Labels {
				if !labelName.MatchString(k) {
					t.Errorf("%s: bad label name %q", where, k)
				}
				if _, err := template.New(k).Funcs(templateFuncs).Parse(templateDefs + v); err != nil {
					t.Errorf("%s: label %s: %v", where, k, err)
				}
			}
			for k, v := range r.Annotations {
				if _, err := template.New(k).Funcs(templateFuncs).Parse(templateDefs + v); err != nil {
					t.Errorf("%s: annotation %s: %v", where, k, err)
				}
			}
			checkExpr(t, where, r.Expr, known, recorded)
			if r.Alert != "" {
				if alerts[r.Alert].Alert != "" {
					t.Errorf("alert %s defined twice", r.Alert)
				}
				alerts[r.Alert] = r
				if s := r.Labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("%s: severity %q", where, s)
				}
				if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("%s: needs a summary and a description", where)
				}
			}
		}
	}

	// The kubernetes-mixin's rule and alert, on pleg's job.
	p99 := ""
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record == "node_quantile:kubelet_pleg_relist_duration_seconds:histogram_quantile" && r.Labels["quantile"] == "0.99" {
				p99 = r.Expr
			}
		}
	}
	for _, want := range []string{"histogram_quantile(0.99,", `kubelet_pleg_relist_duration_seconds_bucket{job="pleg"}[5m]`,
		`group_left (node)`, `kubelet_node_name{job="pleg"}`} {
		if !strings.Contains(p99, want) {
			t.Errorf("the p99 recording rule lacks %q:\n%s", want, p99)
		}
	}
	high := alerts["KubeletPlegDurationHigh"]
	if !strings.Contains(high.Expr, `node_quantile:kubelet_pleg_relist_duration_seconds:histogram_quantile{job="pleg", quantile="0.99"} >= 10`) ||
		high.For != "5m" || high.Labels["severity"] != "warning" {
		t.Errorf("KubeletPlegDurationHigh = %+v", high)
	}
	if !strings.Contains(alerts["PlegRelistStalled"].Expr, "pleg_relist_in_progress_seconds") {
		t.Error("no stalled-relist alert on pleg_relist_in_progress_seconds")
	}
	if !strings.Contains(alerts["PlegPodInspectionTimeouts"].Expr, "pleg_pod_inspection_timeouts_total") {
		t.Error("no alert on pleg_pod_inspection_timeouts_total")
	}
	// A dead daemon: its target down, or no target at all, on the job the
	// ServiceMonitor sets.
	if d := alerts["PlegDown"]; strings.TrimSpace(d.Expr) != `up{job="pleg"} == 0` || d.For == "" {
		t.Errorf("PlegDown = %+v, want up{job=\"pleg\"} == 0 for a while", d)
	}
	if a := alerts["PlegAbsent"]; strings.TrimSpace(a.Expr) != `absent(up{job="pleg"})` || a.For == "" {
		t.Errorf("PlegAbsent = %+v, want absent(up{job=\"pleg\"}) for a while", a)
	}
}

// ---- Grafana dashboard -------------------------------------------------------

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource json.RawMessage          `json:"datasource"`
	GridPos    struct{ X, Y, W, H int } `json:"gridPos"`
	Targets    []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// grafanaVars replaces Grafana's variables with values PromQL parses.
func grafanaVars(expr string) string {
	return regexp.MustCompile(`\$\{?(\w+)\}?`).ReplaceAllStringFunc(expr, func(v string) string {
		switch strings.Trim(v, "${}") {
		case "__rate_interval", "__interval", "__range":
			return "5m"
		case "job":
			return "pleg"
		default:
			return ".*"
		}
	})
}

func TestGrafanaDashboard(t *testing.T) {
	known := exported(t)
	b, err := os.ReadFile("grafana/pleg-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("pleg-dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 30 || len(d.Panels) < 10 {
		t.Errorf("uid %q, title %q, schema %d, %d panels", d.UID, d.Title, d.SchemaVersion, len(d.Panels))
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		// label_values(<selector>, <label>)
		m := regexp.MustCompile(`^label_values\((.+), *(\w+)\)$`).FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, v.Definition)
			continue
		}
		checkExpr(t, "variable "+v.Name, grafanaVars(m[1]), known, nil)
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil || q.Query != v.Definition {
			t.Errorf("variable %s: query %s and definition %q differ", v.Name, v.Query, v.Definition)
		}
	}
	for _, want := range []string{"datasource", "job", "node", "instance"} {
		if !vars[want] {
			t.Errorf("no $%s variable", want)
		}
	}

	ids := map[int]bool{}
	used := map[[2]int]int{} // grid cell -> panel id
	seen := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d repeated", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := used[[2]int{x, y}]; ok {
					t.Errorf("panels %d and %d overlap at %d,%d", other, p.ID, x, y)
				}
				used[[2]int{x, y}] = p.ID
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d: no title or no query", p.ID)
		}
		if !strings.Contains(string(p.Datasource), "${datasource}") {
			t.Errorf("panel %q does not use the $datasource variable", p.Title)
		}
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, `job="$job"`) {
				t.Errorf("panel %q: %s does not select job=\"$job\"", p.Title, tg.Expr)
			}
			for _, n := range checkExpr(t, "panel "+p.Title, grafanaVars(tg.Expr), known, nil) {
				seen[n] = true
			}
		}
	}
	for _, want := range []string{"kubelet_pleg_relist_duration_seconds_bucket", "pleg_relist_in_progress_seconds",
		"pleg_pod_inspection_timeouts_total", "kubelet_pleg_last_seen_seconds", "kubelet_runtime_operations_duration_seconds_bucket"} {
		if !seen[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// ---- node-problem-detector ---------------------------------------------------

type npdConfig struct {
	Plugin       string `json:"plugin"`
	PluginConfig struct {
		InvokeInterval  string `json:"invoke_interval"`
		Timeout         string `json:"timeout"`
		MaxOutputLength int    `json:"max_output_length"`
		Concurrency     int    `json:"concurrency"`
		MessageChange   bool   `json:"enable_message_change_based_condition_update"`
	} `json:"pluginConfig"`
	Source           string `json:"source"`
	MetricsReporting bool   `json:"metricsReporting"`
	Conditions       []struct {
		Type, Reason, Message string
	} `json:"conditions"`
	Rules []struct {
		Type      string   `json:"type"`
		Condition string   `json:"condition"`
		Reason    string   `json:"reason"`
		Path      string   `json:"path"`
		Args      []string `json:"args"`
		Timeout   string   `json:"timeout"`
	} `json:"rules"`
}

func loadNPD(t *testing.T) npdConfig {
	t.Helper()
	b, err := os.ReadFile("npd/pleg-plugin-monitor.json")
	if err != nil {
		t.Fatal(err)
	}
	var c npdConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("pleg-plugin-monitor.json: %v", err)
	}
	return c
}

func TestNPDPluginConfig(t *testing.T) {
	c := loadNPD(t)
	if c.Plugin != "custom" || c.Source == "" {
		t.Errorf("plugin %q, source %q", c.Plugin, c.Source)
	}
	interval, err1 := time.ParseDuration(c.PluginConfig.InvokeInterval)
	timeout, err2 := time.ParseDuration(c.PluginConfig.Timeout)
	if err1 != nil || err2 != nil || timeout >= interval {
		t.Errorf("invoke_interval %q, timeout %q", c.PluginConfig.InvokeInterval, c.PluginConfig.Timeout)
	}
	if c.PluginConfig.MaxOutputLength < 200 {
		t.Errorf("max_output_length %d cuts PLEG's messages", c.PluginConfig.MaxOutputLength)
	}
	if c.PluginConfig.MessageChange {
		t.Error("a condition update on every message change would update it every check (the elapsed time changes)")
	}
	conds := map[string]bool{}
	for _, cd := range c.Conditions {
		conds[cd.Type] = true
		if cd.Reason == "" || cd.Message == "" {
			t.Errorf("condition %s lacks a reason or a message", cd.Type)
		}
	}
	if !conds["PLEGUnhealthy"] {
		t.Error("no PLEGUnhealthy condition")
	}
	if len(c.Rules) == 0 {
		t.Fatal("no rules")
	}
	for _, r := range c.Rules {
		if r.Type != "permanent" && r.Type != "temporary" {
			t.Errorf("rule type %q", r.Type)
		}
		if r.Type == "permanent" && !conds[r.Condition] {
			t.Errorf("rule sets unknown condition %q", r.Condition)
		}
		// NPD exits at start when a rule's path does not exist; /bin/sh
		// always does, and its script reports a pleg binary not in place
		// yet as unknown (2) instead, and execs it otherwise.
		if bin, check := npdPlegCommand(r.Path, r.Args); bin == "" || !strings.HasPrefix(bin, "/") || len(check) == 0 || check[0] != "check" {
			t.Errorf("rule runs %s %q, want /bin/sh -c %q <pleg binary> check ...", r.Path, r.Args, npdWrapper)
		}
		rt, err := time.ParseDuration(r.Timeout)
		if err != nil || rt >= interval {
			t.Errorf("rule timeout %q", r.Timeout)
		}
		var checkTimeout time.Duration
		for _, a := range r.Args {
			if v, ok := strings.CutPrefix(a, "--timeout="); ok {
				checkTimeout, _ = time.ParseDuration(v)
			}
		}
		if checkTimeout <= 0 || checkTimeout >= rt {
			t.Errorf("pleg check --timeout %v must be set and below the rule timeout %v (else NPD kills it: unknown)", checkTimeout, rt)
		}
	}
}

// npdWrapper is the script the NPD rule runs with /bin/sh -c: $0 is the
// pleg binary, the rest pleg's arguments.
const npdWrapper = `test -x "$0" || { echo "cannot run pleg: $0 is not an executable file (not installed yet?)"; exit 2; }; exec "$0" "$@"`

// npdPlegCommand returns the pleg binary an NPD rule runs through the
// wrapper and pleg's arguments ("" if the rule is not the wrapper).
func npdPlegCommand(path string, args []string) (string, []string) {
	if path != "/bin/sh" || len(args) < 3 || args[0] != "-c" || args[1] != npdWrapper {
		return "", nil
	}
	return args[2], args[3:]
}

// TestNPDPatch: the patch puts the binary where the plugin config runs it
// and the config where NPD reads it.
func TestNPDPatch(t *testing.T) {
	c := loadNPD(t)
	docs := decodeYAML(t, "npd/node-problem-detector-patch.yaml")
	if len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	spec := at(t, docs[0], "spec.template.spec")
	if at(t, spec, "hostNetwork") != true {
		t.Error("NPD must use the host's network to reach pleg on 127.0.0.1")
	}
	bin, _ := npdPlegCommand(c.Rules[0].Path, c.Rules[0].Args)
	init := list(t, spec, "initContainers.0.command")
	if fmt.Sprint(init) != fmt.Sprintf("[cp /usr/local/bin/pleg %s]", bin) {
		t.Errorf("init container %v does not copy the binary to %s", init, bin)
	}
	args := list(t, spec, "containers.0.args")
	cfg, _ := flagValue(args, "config.custom-plugin-monitor")
	if !strings.HasSuffix(cfg, "/pleg-plugin-monitor.json") {
		t.Errorf("NPD args %v", args)
	}
	mounts := map[string]string{}
	for _, m := range list(t, spec, "containers.0.volumeMounts") {
		mounts[str(t, m, "mountPath")] = str(t, m, "name")
	}
	if mounts[strings.TrimSuffix(cfg, "/pleg-plugin-monitor.json")] == "" ||
		mounts[strings.TrimSuffix(bin, "/pleg")] == "" {
		t.Errorf("mounts %v do not hold %s and %s", mounts, cfg, bin)
	}
}
