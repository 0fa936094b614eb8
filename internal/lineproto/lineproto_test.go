package lineproto

import (
	"bufio"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The child's side: the configuration, ready, then one answer a command,
// "error" for a failed one, until quit.
func TestServe(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	var cfg struct{ N int }
	go func() {
		defer outW.Close()
		sc := NewScanner(inR)
		if err := ReadConfig(sc, &cfg); err != nil {
			done <- err
			return
		}
		done <- Serve(sc, outW, "ready "+strconv.Itoa(cfg.N), func(name, arg string) (string, error) {
			switch name {
			case "double":
				n, err := strconv.Atoi(arg)
				return strconv.Itoa(2 * n), err
			case "nothing":
				return "", nil
			case "json":
				return JSON(map[string]int{"a": 1})
			}
			return "", errors.New("unknown\ncommand")
		})
	}()
	out := bufio.NewReader(outR)
	say := func(line string) string {
		t.Helper()
		if _, err := io.WriteString(inW, line+"\n"); err != nil {
			t.Fatal(err)
		}
		got, err := out.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(got, "\n")
	}
	for _, c := range []struct{ send, want string }{
		{`{"N": 7}`, "ready 7"},
		{"double 21", "ok 42"},
		{"double x", `error strconv.Atoi: parsing "x": invalid syntax`},
		{"nothing", "ok"},
		{"json", `ok {"a":1}`},
		{"what", "error unknown command"},
	} {
		if got := say(c.send); got != c.want {
			t.Errorf("%q: answer %q, want %q", c.send, got, c.want)
		}
	}
	io.WriteString(inW, "quit\n")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A child that speaks the protocol (a shell script): the parent's calls.
func TestChild(t *testing.T) {
	script := `read cfg; echo "ready $cfg"
while read cmd arg; do
  case $cmd in
  quit) exit 0;;
  echo) echo "ok $arg";;
  *) echo "error no $cmd";;
  esac
done`
	c, ready, err := Start("script", exec.Command("/bin/sh", "-c", script), map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	if ready != `{"n":1}` {
		t.Errorf("ready %q", ready)
	}
	if got, err := c.Call("echo %s", "hello there"); err != nil || got != "hello there" {
		t.Errorf("echo: %q, %v", got, err)
	}
	if n, err := c.CallInt("echo 12"); err != nil || n != 12 {
		t.Errorf("echo 12: %d, %v", n, err)
	}
	var v []int
	if err := c.CallJSON(&v, "echo [1,2]"); err != nil || len(v) != 2 {
		t.Errorf("echo [1,2]: %v, %v", v, err)
	}
	if err := c.CallJSON(&v, "echo nope"); err == nil {
		t.Error("bad JSON: no error")
	}
	if _, err := c.Call("frob"); err == nil || !strings.Contains(err.Error(), "script: frob: no frob") {
		t.Errorf("frob: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// A child that fails: the error carries what it wrote on stderr, and a
// call after it exited fails instead of hanging.
func TestChildFailure(t *testing.T) {
	_, _, err := Start("failing", exec.Command("/bin/sh", "-c", "echo boom >&2; exit 3"), nil)
	if err == nil || !strings.Contains(err.Error(), "failing") || !strings.Contains(err.Error(), "boom") {
		t.Errorf("err = %v", err)
	}
	_, _, err = Start("mute", exec.Command("/bin/sh", "-c", "echo hello"), nil)
	if err == nil || !strings.Contains(err.Error(), `"hello\n" instead of ready`) {
		t.Errorf("err = %v", err)
	}
	c, _, err := Start("short", exec.Command("/bin/sh", "-c", "echo ready; read x; echo gone >&2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call("anything"); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("call to an exited child: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close of a child that exited 0: %v", err)
	}
}
