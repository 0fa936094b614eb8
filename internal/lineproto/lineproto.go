// Package lineproto is the line protocol between a parent process and the
// child processes it measures or drives: `pleg bench` and its children
// (the simulated runtime, pleg's generator, the kubelet-relist program of
// test/kubelet), and the end-to-end suite and the kubelet-relist program.
//
// The parent may first send the child its configuration as one JSON line
// (the kubelet's program takes flags instead); the child answers "ready[
// <info>]". Then the parent sends one command a line, "<name>[ <argument>]",
// and the child answers each with one line, "ok[ <result>]" or "error
// <message>". "quit", or the end of its input, ends the child.
//
// The kubelet-relist program speaks it from its own module: it cannot
// import this package (the two modules pin different Kubernetes versions).
package lineproto

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxLine bounds a line of the protocol either way.
const maxLine = 1 << 20

// Handler serves one command and returns the result to send after "ok".
type Handler func(name, arg string) (string, error)

// NewScanner reads the protocol's lines from in.
func NewScanner(in io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	return sc
}

// ReadConfig reads the configuration line into v.
func ReadConfig(sc *bufio.Scanner, v any) error {
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return err
		}
		return errors.New("no configuration on stdin")
	}
	if err := json.Unmarshal(sc.Bytes(), v); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	return nil
}

// Serve is a child's side of the protocol after its configuration: it
// says ready, then answers every command with handle's result, until quit
// or the end of the input.
func Serve(sc *bufio.Scanner, out io.Writer, ready string, handle Handler) error {
	bw := bufio.NewWriter(out)
	say := func(line string) error {
		bw.WriteString(line)
		bw.WriteByte('\n')
		return bw.Flush()
	}
	if err := say(ready); err != nil {
		return err
	}
	for sc.Scan() {
		name, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if name == "quit" {
			return nil
		}
		res, err := handle(name, arg)
		line := "ok"
		switch {
		case err != nil:
			line = "error " + strings.ReplaceAll(err.Error(), "\n", " ")
		case res != "":
			line += " " + res
		}
		if err := say(line); err != nil {
			return err
		}
	}
	return sc.Err()
}

// JSON is a command's result as JSON.
func JSON(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// Child is the parent's side of one child process.
type Child struct {
	what   string // names the child in errors
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	outR   *os.File      // the read end of its stdout, which Wait leaves open
	stderr *lockedBuffer // to explain a failure
	exited chan struct{} // closed when the process has been waited for
	err    error         // Wait's
}

// Start starts cmd (its standard streams are set here), sends it config
// unless nil, and returns what follows its "ready". what names the child
// in errors. The caller makes cmd with exec.CommandContext: the context
// bounds the child's life.
func Start(what string, cmd *exec.Cmd, config any) (*Child, string, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, "", err
	}
	c := &Child{what: what, cmd: cmd, in: in, out: bufio.NewReaderSize(outR, 64<<10), outR: outR,
		stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = outW, c.stderr
	err = cmd.Start()
	outW.Close()
	if err != nil {
		outR.Close()
		return nil, "", fmt.Errorf("starting the %s: %w", what, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c.handshake(config)
}

func (c *Child) handshake(config any) (*Child, string, error) {
	if config != nil {
		js, err := json.Marshal(config)
		if err != nil {
			c.Kill()
			return nil, "", err
		}
		if _, err := fmt.Fprintf(c.in, "%s\n", js); err != nil {
			c.Kill()
			return nil, "", c.failure(err)
		}
	}
	line, err := c.out.ReadString('\n')
	if head, rest, _ := strings.Cut(strings.TrimRight(line, "\n"), " "); err == nil && head == "ready" {
		return c, rest, nil
	}
	c.Kill()
	if err == nil {
		err = fmt.Errorf("%q instead of ready", line)
	}
	return nil, "", c.failure(err)
}

// Call sends one command (formatted as by fmt.Sprintf) and returns the
// result of its "ok" answer; an "error" answer is an error.
func (c *Child) Call(format string, args ...any) (string, error) {
	line := fmt.Sprintf(format, args...)
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		return "", c.failure(err)
	}
	answer, err := c.out.ReadString('\n')
	if err != nil {
		return "", c.failure(err)
	}
	answer = strings.TrimRight(answer, "\n")
	head, rest, _ := strings.Cut(answer, " ")
	switch head {
	case "ok":
		return rest, nil
	case "error":
		return "", fmt.Errorf("%s: %s: %s", c.what, line, rest)
	}
	return "", fmt.Errorf("%s: %s: unexpected answer %q", c.what, line, answer)
}

// CallJSON sends one command and decodes the JSON of its result into v.
func (c *Child) CallJSON(v any, format string, args ...any) error {
	res, err := c.Call(format, args...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(res), v); err != nil {
		return fmt.Errorf("%s: %s: %w", c.what, fmt.Sprintf(format, args...), err)
	}
	return nil
}

// CallInt sends one command whose result is an integer.
func (c *Child) CallInt(format string, args ...any) (int64, error) {
	res, err := c.Call(format, args...)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(res, 10, 64)
}

// failure explains a broken pipe with what the child wrote on stderr: all
// of it once it has exited, which it is about to when its pipes break.
func (c *Child) failure(err error) error {
	select {
	case <-c.exited:
	case <-time.After(time.Second):
	}
	if msg := strings.TrimSpace(c.stderr.String()); msg != "" {
		return fmt.Errorf("%s: %v: %s", c.what, err, msg)
	}
	return fmt.Errorf("%s: %w", c.what, err)
}

// Close tells the child to quit and waits for it; one that has not exited
// after 10 s is killed.
func (c *Child) Close() error {
	_, _ = io.WriteString(c.in, "quit\n")
	c.in.Close()
	defer c.outR.Close()
	select {
	case <-c.exited:
		if c.err != nil {
			return c.failure(c.err)
		}
		return nil
	case <-time.After(10 * time.Second):
		c.Kill()
		return c.failure(errors.New("killed: it did not quit within 10s"))
	}
}

// Kill ends the child at once.
func (c *Child) Kill() {
	c.in.Close()
	_ = c.cmd.Process.Kill()
	<-c.exited
	c.outR.Close()
}

// lockedBuffer keeps the first 64 KiB a process writes on stderr (exec
// copies it from a goroutine): enough to explain a failure.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 64<<10 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
