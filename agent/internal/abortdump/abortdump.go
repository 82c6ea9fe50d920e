// Package abortdump turns the abort systemd's watchdog sends a hung agent (SIGABRT) into a file
// of every goroutine's stack in the state directory and one log line naming it. Left to the Go
// runtime, SIGABRT prints every goroutine's trace on stderr: hundreds of journal lines in a few
// seconds, burying what came before.
package abortdump

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
)

// Keep is how many dump files are kept in the directory: the newest ones.
const Keep = 5

// ExitCode is the agent's exit status after an abort, as the Go runtime's own after a dump: not
// 0, so that Restart=on-failure restarts the agent also after a SIGABRT that was not the
// watchdog's.
const ExitCode = 2

// The name of a dump file is Prefix, the time of the abort, and Suffix.
const (
	Prefix = "goroutines-"
	Suffix = ".txt"
)

// Watch makes a SIGABRT write the dump into dir, log one line at error level and exit with
// ExitCode. Stopping the agent this way unmaps nothing, like any other exit.
func Watch(dir string, log logrus.FieldLogger) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGABRT)
	go func() {
		<-ch
		OnAbort(dir, log, time.Now())
		os.Exit(ExitCode)
	}()
}

// OnAbort writes the dump into dir and logs one line naming the file, or saying why there is
// none.
func OnAbort(dir string, log logrus.FieldLogger, now time.Time) {
	const next = "the agent exits and systemd restarts it (mapped devices stay mapped)"
	path, err := Write(dir, now)
	if err != nil {
		log.Errorf("watchdog abort (SIGABRT): no goroutine dump: %v; %s", err, next)
		return
	}
	log.Errorf("watchdog abort (SIGABRT): goroutine dump in %s; %s; keep the file for a bug report", path, next)
}

// Write writes every goroutine's stack to dir/goroutines-<UTC time>.txt (mode 0600: a stack
// can hold anything the agent had in hand), through a temporary name and a rename, and removes
// all but the newest Keep dumps. It returns the file's path.
func Write(dir string, now time.Time) (string, error) {
	path := filepath.Join(dir, Prefix+now.UTC().Format("20060102T150405Z")+Suffix)
	f, err := os.CreateTemp(dir, "."+Prefix+"*.tmp") // 0600
	if err != nil {
		return "", err // names the directory
	}
	tmp := f.Name()
	_, err = fmt.Fprintf(f, "rbd-owner agent, pid %d: every goroutine's stack at %s (SIGABRT)\n\n", os.Getpid(), now.UTC().Format(time.RFC3339Nano))
	if err == nil {
		err = pprof.Lookup("goroutine").WriteTo(f, 2)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp) // nothing more to do about it: err names the file and what failed
		return "", err
	}
	prune(dir)
	return path, nil
}

// prune removes all but the newest Keep dumps in dir (their names sort by time). A dump that
// cannot be removed stays; the next abort tries again.
func prune(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var dumps []string
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, Prefix) && strings.HasSuffix(n, Suffix) && e.Type().IsRegular() {
			dumps = append(dumps, n)
		}
	}
	slices.Sort(dumps)
	for len(dumps) > Keep {
		_ = os.Remove(filepath.Join(dir, dumps[0]))
		dumps = dumps[1:]
	}
}
