package e2e

// The supervisor is a second copy of the test binary (re-executed with
// envSupervisor set) that runs for the whole suite, in its own session.
// It exists for two reasons:
//
//  1. It is containerd's parent and a child subreaper
//     (PR_SET_CHILD_SUBREAPER), so the shims containerd daemonizes, and the
//     container processes if a shim dies, are reparented to it and reaped
//     at once. Without it they would be reparented to PID 1 (which, on
//     these machines, reaps lazily) or outlive the suite.
//  2. It cleans up even when the test process dies without tearing down
//     (panic in a test, -timeout, SIGKILL): when its command pipe hits EOF
//     before a "teardown" command, it tears down by itself.
//
// Protocol: one command per line on the supervisor's stdin; one reply line
// per command, "ok ..." or "err ...", on fd 3. Commands:
//
//	start            start containerd                       -> ok <pid>
//	stop <ms>        SIGTERM, after <ms> SIGKILL, wait      -> ok <how it ended>
//	kill             SIGKILL containerd and wait            -> ok <how it ended>
//	status           -> ok running <pid> | ok stopped <last exit>
//	teardown         stop containerd, kill all our processes, unmount
//	                 everything under the dir, remove our cgroups, shim
//	                 sockets and the dir                     -> ok <summary>
//
// The supervisor's stdout/stderr go to <dir>/supervisor.log, which is
// copied to <cache>/last-abnormal-teardown.log after an abnormal teardown.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	envSupervisor        = "PLEG_E2E_SUPERVISOR" // the private dir
	envSupervisorBin     = "PLEG_E2E_SUPERVISOR_BIN"
	envSupervisorCgroup  = "PLEG_E2E_SUPERVISOR_CGROUP"
	envSupervisorRunDir  = "PLEG_E2E_SUPERVISOR_RUNDIR_MADE"
	envSupervisorLogCopy = "PLEG_E2E_SUPERVISOR_LOG_COPY"
	// envSupervisorArgv is the runtime's command line, as a JSON array
	// (CRI-O's; containerd's --config <dir>/config.toml when unset), and
	// envSupervisorLog the name of its log file in the dir.
	envSupervisorArgv   = "PLEG_E2E_SUPERVISOR_ARGV"
	envSupervisorLog    = "PLEG_E2E_SUPERVISOR_LOG"
	prSetChildSubreaper = 36
)

// ---- client side (the test process) ---------------------------------------

type supervisorClient struct {
	mu      sync.Mutex
	cmd     *exec.Cmd
	in      io.WriteCloser
	replyR  *os.File
	reply   *bufio.Reader
	exited  chan struct{}
	broken  error
	running func() bool
}

func startSupervisor(e *env) (*supervisorClient, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(e.dir, "supervisor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	replyR, replyW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer replyW.Close()
	cmd := exec.Command(exe)
	if len(e.enter) > 0 { // a cluster node's namespaces (nodeNS.enter)
		cmd = exec.Command(e.enter[0], append(e.enter[1:], exe)...)
	}
	cmd.Dir = e.dir
	runDirMade := "0"
	if e.runDirMade {
		runDirMade = "1"
	}
	cmd.Env = append(os.Environ(),
		envSupervisor+"="+e.dir,
		envSupervisorBin+"="+e.binDir,
		envSupervisorCgroup+"="+e.cgroupParent,
		envSupervisorRunDir+"="+runDirMade,
		envSupervisorLogCopy+"="+filepath.Join(e.cacheDir, "last-abnormal-teardown.log"),
		envSupervisorLog+"="+filepath.Base(e.logPath),
	)
	if e.kind == kindCRIO {
		argv, err := json.Marshal(e.crioArgv())
		if err != nil {
			return nil, err
		}
		cmd.Env = append(cmd.Env, envSupervisorArgv+"="+string(argv))
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.ExtraFiles = []*os.File{replyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		replyR.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		replyR.Close()
		return nil, fmt.Errorf("starting the supervisor: %w", err)
	}
	c := &supervisorClient{cmd: cmd, in: in, replyR: replyR, reply: bufio.NewReader(replyR), exited: make(chan struct{})}
	go func() { cmd.Wait(); close(c.exited) }()
	c.running = func() bool {
		r, err := c.call("status", 5*time.Second)
		return err == nil && strings.HasPrefix(r, "running")
	}
	if _, err := c.call("status", 10*time.Second); err != nil {
		return nil, fmt.Errorf("supervisor does not answer: %w", err)
	}
	return c, nil
}

// call sends one command and returns the reply without its "ok " prefix.
func (c *supervisorClient) call(command string, timeout time.Duration) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return "", c.broken
	}
	if _, err := io.WriteString(c.in, command+"\n"); err != nil {
		c.broken = fmt.Errorf("supervisor gone: %w", err)
		return "", c.broken
	}
	c.replyR.SetReadDeadline(time.Now().Add(timeout))
	line, err := c.reply.ReadString('\n')
	if err != nil {
		c.broken = fmt.Errorf("no reply from the supervisor to %q: %w", command, err)
		return "", c.broken
	}
	line = strings.TrimSuffix(line, "\n")
	if r, ok := strings.CutPrefix(line, "ok"); ok {
		return strings.TrimSpace(r), nil
	}
	return "", fmt.Errorf("supervisor %s: %s", command, strings.TrimPrefix(line, "err "))
}

// teardown asks the supervisor to clean up everything, then waits for it to
// exit.
func (c *supervisorClient) teardown() (string, error) {
	summary, err := c.call("teardown", 90*time.Second)
	c.in.Close()
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
		if err == nil {
			err = errors.New("supervisor did not exit after teardown")
		}
	}
	c.replyR.Close()
	return summary, err
}

// ---- server side (the supervisor process) ---------------------------------

type supervisor struct {
	dir, bin, cgroupParent string
	argv                   []string // the runtime's command line
	logName                string   // its log file, in dir
	runDirMade             bool
	reply                  *os.File

	mu       sync.Mutex
	waiters  map[int]chan syscall.WaitStatus
	ctdPid   int
	ctdDone  chan syscall.WaitStatus // receives containerd's exit status
	lastExit string
}

func supervisorMain() int {
	s := &supervisor{
		dir:          os.Getenv(envSupervisor),
		bin:          os.Getenv(envSupervisorBin),
		cgroupParent: os.Getenv(envSupervisorCgroup),
		runDirMade:   os.Getenv(envSupervisorRunDir) == "1",
		reply:        os.NewFile(3, "reply"),
		waiters:      map[int]chan syscall.WaitStatus{},
		lastExit:     "never started",
	}
	log := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s supervisor: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	if !strings.HasPrefix(filepath.Base(s.dir), "pleg-e2e-") {
		log("refusing to run on %q", s.dir)
		return 2
	}
	s.argv = []string{filepath.Join(s.bin, "containerd"), "--config", filepath.Join(s.dir, "config.toml")}
	if a := os.Getenv(envSupervisorArgv); a != "" {
		if err := json.Unmarshal([]byte(a), &s.argv); err != nil || len(s.argv) == 0 {
			log("bad %s %q: %v", envSupervisorArgv, a, err)
			return 2
		}
	}
	if s.logName = os.Getenv(envSupervisorLog); s.logName == "" {
		s.logName = "containerd.log"
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE)
	// fd 3 was inherited without close-on-exec; keep containerd and the
	// shims from inheriting it in turn.
	syscall.CloseOnExec(3)
	// Lets a later run recognise this dir as stale if we die (sweepStale).
	if err := os.WriteFile(filepath.Join(s.dir, ownerFile), []byte(processIdentity(os.Getpid())), 0o644); err != nil {
		log("writing %s: %v", ownerFile, err)
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		log("PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	go s.reapLoop()
	log("started, pid %d, dir %s", os.Getpid(), s.dir)

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(strings.TrimSpace(in.Text()), " ")
		var reply string
		switch cmd {
		case "start":
			pid, err := s.startContainerd()
			if err != nil {
				reply = "err " + err.Error()
			} else {
				reply = fmt.Sprintf("ok %d", pid)
			}
		case "stop":
			ms, _ := strconv.Atoi(arg)
			reply = "ok " + s.stopContainerd(time.Duration(ms)*time.Millisecond)
		case "kill":
			reply = "ok " + s.stopContainerd(0)
		case "status":
			s.mu.Lock()
			if s.ctdPid != 0 {
				reply = fmt.Sprintf("ok running %d", s.ctdPid)
			} else {
				reply = "ok stopped " + s.lastExit
			}
			s.mu.Unlock()
		case "teardown":
			summary, err := s.teardown()
			log("teardown: %s (err=%v)", summary, err)
			if err != nil {
				reply = "err " + summary + ": " + strings.ReplaceAll(err.Error(), "\n", "; ")
			} else {
				reply = "ok " + summary
			}
			fmt.Fprintln(s.reply, reply)
			return 0
		default:
			reply = "err unknown command " + strconv.Quote(cmd)
		}
		log("%s %s -> %s", cmd, arg, reply)
		fmt.Fprintln(s.reply, reply)
	}
	// The test process is gone without a teardown command.
	log("command pipe closed without teardown: cleaning up by myself")
	summary, err := s.teardown()
	log("teardown: %s (err=%v)", summary, err)
	if dst := os.Getenv(envSupervisorLogCopy); dst != "" {
		copySelfLog(s.dir, dst)
	}
	return 0
}

// copySelfLog saves the supervisor log; the dir itself is gone by now, but
// our stderr is still open on the (unlinked) file.
func copySelfLog(dir, dst string) {
	src, err := os.Open("/proc/self/fd/2")
	if err != nil {
		return
	}
	defer src.Close()
	out, err := os.Create(dst)
	if err != nil {
		return
	}
	defer out.Close()
	src.Seek(0, io.SeekStart)
	io.Copy(out, src)
	fmt.Fprintf(out, "(supervisor log of %s)\n", dir)
}

// reapLoop reaps every child: containerd, and the orphans (shims,
// container processes) that the kernel reparents to us as subreaper.
func (s *supervisor) reapLoop() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil { // ECHILD: nothing to reap yet
			time.Sleep(20 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if ch, ok := s.waiters[pid]; ok {
			delete(s.waiters, pid)
			ch <- ws
		}
		s.mu.Unlock()
	}
}

func describeExit(ws syscall.WaitStatus) string {
	switch {
	case ws.Signaled():
		return "signal: " + ws.Signal().String()
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	}
	return fmt.Sprintf("wait status %#x", uint32(ws))
}

func (s *supervisor) startContainerd() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctdPid != 0 {
		return 0, fmt.Errorf("containerd already running (pid %d)", s.ctdPid)
	}
	logFile, err := os.OpenFile(filepath.Join(s.dir, s.logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logFile.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devNull.Close()
	fmt.Fprintf(logFile, "==== %s: starting %s\n", time.Now().Format(time.RFC3339Nano), filepath.Base(s.argv[0]))
	bin := s.argv[0]
	env := []string{"PATH=" + s.bin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "PLEG_E2E_") {
			env = append(env, kv)
		}
	}
	// Hold s.mu across fork and registration so reapLoop cannot reap the
	// pid before we are waiting for it.
	pid, err := syscall.ForkExec(bin, s.argv, &syscall.ProcAttr{
		Dir:   s.dir,
		Env:   env,
		Files: []uintptr{devNull.Fd(), logFile.Fd(), logFile.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", bin, err)
	}
	ch := make(chan syscall.WaitStatus, 1)
	done := make(chan syscall.WaitStatus, 1)
	s.waiters[pid] = ch
	s.ctdPid, s.ctdDone = pid, done
	go func() {
		ws := <-ch
		s.mu.Lock()
		s.ctdPid = 0
		s.lastExit = describeExit(ws)
		s.mu.Unlock()
		done <- ws
	}()
	return pid, nil
}

// stopContainerd sends SIGTERM (or SIGKILL at once when grace is 0), then
// SIGKILL after grace, and waits until containerd has been reaped.
func (s *supervisor) stopContainerd(grace time.Duration) string {
	s.mu.Lock()
	pid, done := s.ctdPid, s.ctdDone
	s.mu.Unlock()
	if pid == 0 {
		return "not running"
	}
	if grace > 0 {
		syscall.Kill(pid, syscall.SIGTERM)
		select {
		case ws := <-done:
			return describeExit(ws)
		case <-time.After(grace):
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	return describeExit(<-done)
}

// teardown removes everything of ours; see the file comment.
func (s *supervisor) teardown() (string, error) {
	var errs []error
	ctd := s.stopContainerd(5 * time.Second)

	// Shim sockets live in /run/containerd/s, named after our socket
	// address; note them before the shims die.
	sockets := shimSockets(s.dir)

	killed, err := killOurProcesses(s.dir, s.cgroupParent, os.Getpid(), 15*time.Second)
	if err != nil {
		errs = append(errs, err)
	}
	unmounted, err := unmountUnder(s.dir)
	if err != nil {
		errs = append(errs, err)
	}
	cgroups, err := removeCgroups(s.dir, s.cgroupParent)
	if err != nil {
		errs = append(errs, err)
	}
	removedSockets := 0
	for _, p := range sockets {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if err := os.Remove(p); err == nil {
				removedSockets++
			}
		}
	}
	if s.runDirMade {
		// Only removes them if empty, i.e. nobody else uses them.
		os.Remove("/run/containerd/s")
		os.Remove("/run/containerd")
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	summary := fmt.Sprintf("%s %s; killed %d processes; unmounted %d; removed %d cgroups, %d shim sockets, %s",
		filepath.Base(s.argv[0]), ctd, killed, unmounted, cgroups, removedSockets, s.dir)
	return summary, errors.Join(errs...)
}
