package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

// ChildEnv is the environment variable that makes a binary serve the
// simulated runtime of a benchmark run instead of doing its usual work
// (see MaybeServeChild). Its value must be "1".
const ChildEnv = "PLEG_BENCH_RUNTIME_CHILD"

// MaybeServeChild serves the simulated runtime of a benchmark run on stdin
// and stdout and exits the process, if ChildEnv is set; otherwise it
// returns at once. Binaries that run benchmarks with the simulated runtime
// in a child process (the default) call it first thing: pleg's main
// package from an init function, test binaries from TestMain.
//
// With RelisterEnv set instead, it serves pleg's relister (ServeRelister)
// configured by that variable's JSON value.
func MaybeServeChild() {
	if js, ok := os.LookupEnv(RelisterEnv); ok {
		var c plegConfig
		err := json.Unmarshal([]byte(js), &c)
		if err == nil {
			err = ServeRelister(c, os.Stdin, os.Stdout)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "pleg bench relister: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(ChildEnv) != "1" {
		return
	}
	if err := ServeChild(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "pleg bench runtime: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// DefaultChildCommand re-executes the running binary with ChildEnv set.
func DefaultChildCommand() (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the running binary to serve the simulated runtime: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), ChildEnv+"=1")
	return cmd, nil
}

// The child protocol is line based. The parent sends the simConfig as one
// JSON line; the child answers "ready <endpoint>". Then the parent sends
// one command per line and the child answers each with "ok[ <result>]" or
// "error <message>":
//
//	latency <duration>   set the latency of every call
//	change <n>           change n distinct pods; answers the number changed
//	hang                 hang one pod's status calls and change it; answers its UID
//	cpu                  answers the child's CPU time (user + system) in ns
//	hang-live [lists]    hang one pod's status calls (and its filtered list
//	                     calls with "lists") without changing it; answers its UID
//	emit <uid> <every>   stream an event for the pod every interval
//	storm <n>            stream n events per second over every pod
//	podcalls <uid>       answers the calls received for the pod, as JSON
//	eventstats           answers the event counters, as JSON
//	quit                 stop; the child exits (as it does on end of input)

// ServeChild runs the child side of the protocol until quit or the end of
// in.
func ServeChild(in io.Reader, out io.Writer) error {
	// The simulator stands for the runtime, another program: it runs with
	// Go's default GC target, not the one the pleg binary it is started
	// from sets for the daemon, unless GOGC says otherwise.
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(100)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return err
		}
		return errors.New("no configuration on stdin")
	}
	var cfg simConfig
	if err := json.Unmarshal(sc.Bytes(), &cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if cfg.Socket == "" {
		return errors.New("configuration: no socket")
	}
	r := sim.New(cfg.sim())
	if err := r.Serve(cfg.Socket); err != nil {
		return err
	}
	defer r.Stop()
	w := newWorkload(r)
	return serveLines(sc, out, "ready "+r.Endpoint(), func(cmd, arg string, reply replyFunc) (err error) {
		switch cmd {
		case "latency":
			var d time.Duration
			if d, err = time.ParseDuration(arg); err == nil {
				r.SetLatency(sim.Latency{Base: d})
				err = reply("ok")
			}
		case "change":
			var n int
			if n, err = strconv.Atoi(arg); err == nil {
				if n, err = w.change(n); err == nil {
					err = reply("ok %d", n)
				}
			}
		case "hang":
			var uid string
			if uid, err = w.hang(); err == nil {
				err = reply("ok %s", uid)
			}
		case "cpu":
			err = reply("ok %d", int64(processCPU()))
		case "hang-live":
			var uid string
			if uid, err = w.hangLive(arg == "lists"); err == nil {
				err = reply("ok %s", uid)
			}
		case "emit":
			uid, every, _ := strings.Cut(arg, " ")
			var d time.Duration
			if d, err = time.ParseDuration(every); err == nil {
				r.EmitEvents(uid, d)
				err = reply("ok")
			}
		case "storm":
			var n int
			if n, err = strconv.Atoi(arg); err == nil {
				r.SetEventStorm(n)
				err = reply("ok")
			}
		case "podcalls":
			js, _ := json.Marshal(r.PodCalls(arg))
			err = reply("ok %s", js)
		case "eventstats":
			js, _ := json.Marshal(r.EventStats())
			err = reply("ok %s", js)
		default:
			err = fmt.Errorf("unknown command %q", cmd)
		}
		return err
	})
}

// replyFunc writes one reply line to the parent.
type replyFunc func(format string, args ...any) error

// serveLines is a child's side of the line protocol: it says ready, then
// hands each command line ("cmd arg...") to handle, which replies itself;
// an error handle returns is answered "error <message>" on one line.
// "quit" or the end of input ends it.
func serveLines(sc *bufio.Scanner, out io.Writer, ready string, handle func(cmd, arg string, reply replyFunc) error) error {
	bw := bufio.NewWriter(out)
	reply := func(format string, args ...any) error {
		fmt.Fprintf(bw, format+"\n", args...)
		return bw.Flush()
	}
	if err := reply("%s", ready); err != nil {
		return err
	}
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if cmd == "quit" {
			return nil
		}
		if err := handle(cmd, arg, reply); err != nil {
			if rerr := reply("error %s", strings.ReplaceAll(err.Error(), "\n", " ")); rerr != nil {
				return rerr
			}
		}
	}
	return sc.Err()
}

// childDriver runs the simulated runtime in a child process.
type childDriver struct {
	lineChild
	dir      string
	endpoint string
}

// lineChild is the parent's side of a child process that speaks the line
// protocol (serveLines): one command line, one answer line.
type lineChild struct {
	what   string // names the child in errors
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *lockedBuffer
}

func startChild(cmd *exec.Cmd, cfg simConfig) (_ *childDriver, err error) {
	dir, err := os.MkdirTemp("", "pleg-bench-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	cfg.Socket = filepath.Join(dir, "cri.sock")
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the simulated runtime process: %w", err)
	}
	d := &childDriver{lineChild: lineChild{what: "simulated runtime", cmd: cmd, in: in, out: bufio.NewReader(outPipe), stderr: stderr}, dir: dir}
	cfgLine, _ := json.Marshal(cfg)
	ready, err := d.request(string(cfgLine), "ready")
	if err != nil {
		d.kill()
		return nil, err
	}
	d.endpoint = ready
	return d, nil
}

// request sends one line and reads the answer, which must start with want.
func (c *lineChild) request(line, want string) (string, error) {
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		return "", c.failure(err)
	}
	return c.read(want)
}

// read reads one answer, which must start with want, and returns the rest.
func (c *lineChild) read(want string) (string, error) {
	answer, err := c.out.ReadString('\n')
	if err != nil {
		return "", c.failure(err)
	}
	answer = strings.TrimRight(answer, "\n")
	head, rest, _ := strings.Cut(answer, " ")
	switch head {
	case want:
		return rest, nil
	case "error":
		return "", fmt.Errorf("%s: %s", c.what, rest)
	}
	return "", fmt.Errorf("%s: unexpected answer %q", c.what, answer)
}

// failure turns a broken pipe into an error carrying the child's stderr.
func (c *lineChild) failure(err error) error {
	if msg := strings.TrimSpace(c.stderr.String()); msg != "" {
		return fmt.Errorf("%s process: %v: %s", c.what, err, msg)
	}
	return fmt.Errorf("%s process: %w", c.what, err)
}

func (d *childDriver) Endpoint() string { return d.endpoint }

func (d *childDriver) SetLatency(l time.Duration) error {
	_, err := d.request("latency "+l.String(), "ok")
	return err
}

func (d *childDriver) Change(n int) (int, error) {
	got, err := d.request("change "+strconv.Itoa(n), "ok")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(got)
}

func (d *childDriver) Hang() (string, error) { return d.request("hang", "ok") }

func (d *childDriver) CPU() (time.Duration, error) {
	got, err := d.request("cpu", "ok")
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(got, 10, 64)
	return time.Duration(ns), err
}

func (d *childDriver) HangLive(lists bool) (string, error) {
	line := "hang-live"
	if lists {
		line += " lists"
	}
	return d.request(line, "ok")
}

func (d *childDriver) EmitEvents(uid string, every time.Duration) error {
	_, err := d.request("emit "+uid+" "+every.String(), "ok")
	return err
}

func (d *childDriver) EventStorm(perSecond int) error {
	_, err := d.request("storm "+strconv.Itoa(perSecond), "ok")
	return err
}

func (d *childDriver) PodCalls(uid string) (map[string]int64, error) {
	got, err := d.request("podcalls "+uid, "ok")
	if err != nil {
		return nil, err
	}
	var calls map[string]int64
	return calls, json.Unmarshal([]byte(got), &calls)
}

func (d *childDriver) EventStats() (sim.EventStats, error) {
	got, err := d.request("eventstats", "ok")
	if err != nil {
		return sim.EventStats{}, err
	}
	var st sim.EventStats
	return st, json.Unmarshal([]byte(got), &st)
}

func (d *childDriver) Close() error {
	err := d.quit()
	os.RemoveAll(d.dir)
	if err != nil {
		return d.failure(err)
	}
	return nil
}

// quit tells the child to quit and waits for it to exit, killing it after
// 10 s.
func (c *lineChild) quit() error {
	_, _ = io.WriteString(c.in, "quit\n")
	c.in.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		return <-done
	}
}

// kill kills the child at once.
func (c *lineChild) kill() {
	c.in.Close()
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil // enough to explain a failure
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
