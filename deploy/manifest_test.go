package deploy

// Checks of what the manifests promise an operator beyond parsing: the
// image's reference and its pinned bases, the user pleg runs as, the
// namespace's pod-security level and the Go memory limit.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// manifestObjects returns the objects of kubernetes/pleg.yaml by kind.
func manifestObjects(t *testing.T) map[string]object {
	t.Helper()
	out := map[string]object{}
	for _, d := range decodeYAML(t, "kubernetes/pleg.yaml") {
		out[str(t, d, "kind")] = d
	}
	for _, kind := range []string{"Namespace", "DaemonSet"} {
		if out[kind] == nil {
			t.Fatalf("no %s in kubernetes/pleg.yaml", kind)
		}
	}
	return out
}

func plegContainer(t *testing.T, ds object) object {
	t.Helper()
	c, ok := list(t, ds, "spec.template.spec.containers")[0].(object)
	if !ok {
		t.Fatal("the DaemonSet's container is not a mapping")
	}
	return c
}

// imageRefRE is a fully qualified image reference with a release tag:
// registry host, repository, vMAJOR.MINOR.PATCH. Fully qualified because
// CRI-O's short-name policy may refuse a short name; a release tag because
// a moving tag (latest) gives nodes different binaries.
var imageRefRE = regexp.MustCompile(`^[a-z0-9-]+(\.[a-z0-9-]+)+(:[0-9]+)?/[a-z0-9._-]+(/[a-z0-9._-]+)*/pleg:v[0-9]+\.[0-9]+\.[0-9]+$`)

// mentionRE finds image references of pleg in prose and files.
var mentionRE = regexp.MustCompile(`([a-z0-9.-]+/)*pleg:[A-Za-z0-9._-]+`)

// TestImageReference: the DaemonSet's image is the one place the image's
// version is set. It is a release tag with a pull policy that fits it,
// and every other file that names the image names the same reference.
func TestImageReference(t *testing.T) {
	c := plegContainer(t, manifestObjects(t)["DaemonSet"])
	ref := str(t, c, "image")
	if !imageRefRE.MatchString(ref) {
		t.Errorf("the DaemonSet's image %q is not REGISTRY/.../pleg:vX.Y.Z (a fully qualified reference with a release tag)", ref)
	}
	// A release tag does not move: pull it once per node. (Always would
	// make every pod start depend on the registry; with :latest,
	// IfNotPresent leaves each node on whatever it pulled first.)
	if p := str(t, c, "imagePullPolicy"); p != "IfNotPresent" {
		t.Errorf("imagePullPolicy %q, want IfNotPresent for the release tag %s", p, ref)
	}

	npd := decodeYAML(t, "npd/node-problem-detector-patch.yaml")[0]
	ic := list(t, npd, "spec.template.spec.initContainers")[0]
	if got := str(t, ic, "image"); got != ref {
		t.Errorf("NPD's init container copies pleg out of %q, the DaemonSet runs %q", got, ref)
	}
	if got := str(t, ic, "imagePullPolicy"); got != "IfNotPresent" {
		t.Errorf("NPD's init container: imagePullPolicy %q, want IfNotPresent", got)
	}

	// Every mention in the deploy files and the documentation.
	files := []string{"Dockerfile", "README.md", "../README.md"}
	for _, glob := range []string{"kubernetes/*.yaml", "kubernetes-crio/*.yaml", "npd/*", "../docs/*.md"} {
		m, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	mentioned := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mentionRE.FindAllString(string(b), -1) {
			mentioned++
			if m != ref {
				t.Errorf("%s names the image %s; the DaemonSet's is %s", f, m, ref)
			}
		}
	}
	if mentioned < 4 {
		t.Errorf("the image %s is named %d times in the deploy files and docs; want at least the DaemonSet, NPD's patch, the Dockerfile's and the README's build commands", ref, mentioned)
	}
}

// dockerfile is what these tests read of deploy/Dockerfile.
type dockerfile struct {
	froms []string // FROM references, in order
	user  string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerfile
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		if len(w) < 2 || strings.HasPrefix(w[0], "#") {
			continue
		}
		switch strings.ToUpper(w[0]) {
		case "FROM":
			d.froms = append(d.froms, w[1])
		case "USER":
			d.user = w[1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return d
}

// imageUser parses a numeric USER uid[:gid].
func imageUser(user string) (uid, gid int64, err error) {
	u, g, hasGroup := strings.Cut(user, ":")
	if uid, err = strconv.ParseInt(u, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("USER %q is not a numeric uid (the kubelet can check runAsNonRoot only for a numeric one)", user)
	}
	gid = uid
	if hasGroup {
		if gid, err = strconv.ParseInt(g, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("USER %q: the group is not numeric", user)
		}
	}
	return uid, gid, nil
}

var pinnedRE = regexp.MustCompile(`^([a-z0-9./_-]+):([A-Za-z0-9._-]+)@sha256:[0-9a-f]{64}$`)

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"./cmd/pleg", "CGO_ENABLED=0", "/usr/local/bin/pleg", `ENTRYPOINT ["/usr/local/bin/pleg"]`} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	d := readDockerfile(t)
	if len(d.froms) != 2 {
		t.Fatalf("FROM %v: want the build stage and the final one", d.froms)
	}
	// Bases pinned by digest, each with its tag for the reader.
	for _, from := range d.froms {
		if !pinnedRE.MatchString(from) {
			t.Errorf("FROM %s is not pinned: want NAME:TAG@sha256:<64 hex digits>", from)
		}
	}
	// The build stage's Go is at least go.mod's: the golang image sets
	// GOTOOLCHAIN=local and would refuse an older one.
	if m := pinnedRE.FindStringSubmatch(d.froms[0]); m != nil {
		goMod := goDirective(t)
		if m[1] != "golang" || !versionAtLeast(m[2], goMod) {
			t.Errorf("the build stage is %s:%s; go.mod needs go %s", m[1], m[2], goMod)
		}
	}
	// A numeric non-root user.
	uid, _, err := imageUser(d.user)
	if err != nil {
		t.Error(err)
	} else if uid == 0 {
		t.Errorf("USER %q is root", d.user)
	}
}

// goDirective is go.mod's go version.
func goDirective(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("go.mod has no go directive")
	return ""
}

// versionAtLeast compares dotted numeric versions ("1.26.8" >= "1.26").
func versionAtLeast(v, min string) bool {
	a, b := strings.Split(v, "."), strings.Split(min, ".")
	for i := range max(len(a), len(b)) {
		var x, y int
		if i < len(a) {
			n, err := strconv.Atoi(a[i])
			if err != nil {
				return false
			}
			x = n
		}
		if i < len(b) {
			y, _ = strconv.Atoi(b[i])
		}
		if x != y {
			return x > y
		}
	}
	return true
}

// TestRunAsUser: the manifest says which user pleg runs as (the image's
// non-root user cannot open a root:root socket), and the non-root patch
// runs the image's user with the socket's group.
func TestRunAsUser(t *testing.T) {
	objs := manifestObjects(t)
	ds := objs["DaemonSet"]
	c := plegContainer(t, ds)
	uid, gid, err := imageUser(readDockerfile(t).user)
	if err != nil {
		t.Fatal(err)
	}
	sc, _ := c["securityContext"].(object)
	if _, ok := sc["runAsUser"].(int); !ok {
		t.Errorf("the container does not set runAsUser: it would run as the image's uid %d, which may not use the runtime's root:root socket", uid)
	}
	if sc["allowPrivilegeEscalation"] != false || fmt.Sprint(at(t, sc, "capabilities.drop")) != "[ALL]" {
		t.Errorf("securityContext %v: want no privilege escalation and every capability dropped", sc)
	}

	// The patch: the DaemonSet's container by name, the image's uid and
	// gid, runAsNonRoot, and the socket's group as a supplemental group.
	docs := decodeYAML(t, "kubernetes/pleg-nonroot-patch.yaml")
	if len(docs) != 1 {
		t.Fatalf("pleg-nonroot-patch.yaml: %d documents", len(docs))
	}
	p := docs[0]
	groups := list(t, p, "spec.template.spec.securityContext.supplementalGroups")
	if len(groups) != 1 {
		t.Errorf("supplementalGroups %v: want the socket's group", groups)
	} else if _, ok := groups[0].(int); !ok {
		t.Errorf("supplementalGroups %v: not a gid", groups)
	}
	pcs := list(t, p, "spec.template.spec.containers")
	if len(pcs) != 1 || str(t, pcs[0], "name") != str(t, c, "name") {
		t.Fatalf("the patch's containers %v do not name the DaemonSet's %s", pcs, str(t, c, "name"))
	}
	psc := at(t, pcs[0], "securityContext")
	if num(t, psc, "runAsUser") != int(uid) || num(t, psc, "runAsGroup") != int(gid) || at(t, psc, "runAsNonRoot") != true {
		t.Errorf("the patch's securityContext %v: want runAsUser %d, runAsGroup %d (the image's USER) and runAsNonRoot", psc, uid, gid)
	}
}

// podSecurityLevel is the least Pod Security Standards level that admits
// a pod spec, for the settings this manifest can have: host namespaces,
// hostPath volumes, host ports and privileged containers need
// "privileged"; running as root or without a seccomp profile, "baseline".
func podSecurityLevel(t *testing.T, spec object) string {
	t.Helper()
	for _, ns := range []string{"hostNetwork", "hostPID", "hostIPC"} {
		if spec[ns] == true {
			return "privileged"
		}
	}
	vols, _ := spec["volumes"].([]any)
	for _, v := range vols {
		if _, ok := v.(object)["hostPath"]; ok {
			return "privileged"
		}
	}
	level := "restricted"
	cs, _ := spec["containers"].([]any)
	ics, _ := spec["initContainers"].([]any)
	for _, c := range append(cs, ics...) {
		c := c.(object)
		ports, _ := c["ports"].([]any)
		for _, p := range ports {
			if n, _ := p.(object)["hostPort"].(int); n != 0 {
				return "privileged"
			}
		}
		sc, _ := c["securityContext"].(object)
		if sc["privileged"] == true {
			return "privileged"
		}
		if caps, _ := sc["capabilities"].(object); caps["add"] != nil {
			return "privileged"
		}
		if sc["runAsNonRoot"] != true || sc["allowPrivilegeEscalation"] != false {
			level = "baseline"
		}
	}
	return level
}

// TestPodSecurityLabel: the namespace admits the DaemonSet's pods under
// Pod Security Admission, at the level its settings need and no looser.
func TestPodSecurityLabel(t *testing.T) {
	objs := manifestObjects(t)
	want := podSecurityLevel(t, at(t, objs["DaemonSet"], "spec.template.spec").(object))
	if want != "privileged" {
		t.Logf("the pods would pass %q", want)
	}
	labels := at(t, objs["Namespace"], "metadata.labels").(object)
	for _, mode := range []string{"enforce", "audit", "warn"} {
		if got := labels["pod-security.kubernetes.io/"+mode]; got != want {
			t.Errorf("namespace label pod-security.kubernetes.io/%s = %v, want %q (what the DaemonSet's pod needs)", mode, got, want)
		}
	}
}

// goMemLimitRE is GOMEMLIMIT's syntax (runtime/debug.SetMemoryLimit).
var goMemLimitRE = regexp.MustCompile(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`)

// TestGOMEMLIMIT: the Go runtime's soft limit is about 90% of the
// container's memory limit: below it, so that the runtime collects before
// the kernel kills, with room for what the soft limit does not count.
func TestGOMEMLIMIT(t *testing.T) {
	c := plegContainer(t, manifestObjects(t)["DaemonSet"])
	limitText := str(t, c, "resources.limits.memory")
	limit, err := quantityBytes(limitText)
	if err != nil {
		t.Fatalf("resources.limits.memory: %v", err)
	}
	var value string
	for _, e := range list(t, c, "env") {
		if str(t, e, "name") == "GOMEMLIMIT" {
			v, ok := e.(object)["value"].(string)
			if !ok {
				t.Fatalf("GOMEMLIMIT %v: want a fixed value (the downward API gives the whole limit, not 90%% of it)", e)
			}
			value = v
		}
	}
	m := goMemLimitRE.FindStringSubmatch(value)
	if m == nil {
		t.Fatalf("GOMEMLIMIT %q is not a byte count the Go runtime accepts", value)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	n <<= map[string]int{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]]
	ratio := float64(n) / float64(limit)
	if ratio < 0.85 || ratio > 0.95 {
		t.Errorf("GOMEMLIMIT %s is %.1f%% of the memory limit %s, want about 90%%", value, 100*ratio, limitText)
	}
}

// quantityRE is the part of Kubernetes' quantity syntax a memory limit
// uses: an integer with an optional binary or decimal suffix.
var quantityRE = regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$`)

// quantityBytes converts a memory quantity such as "128Mi" to bytes.
func quantityBytes(q string) (int64, error) {
	m := quantityRE.FindStringSubmatch(q)
	if m == nil {
		return 0, fmt.Errorf("%q: not an integer with a Ki/Mi/Gi/Ti or k/M/G/T suffix", q)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", q, err)
	}
	mult := map[string]int64{"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
		"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m[2]]
	return n * mult, nil
}
