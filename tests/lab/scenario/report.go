//go:build lab

package scenario

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Suite is a scenario run's assertions: each prints "PASS: NAME" or "FAIL: NAME" with what it
// saw, and counts; Close prints the steps' wall times and the closing line "N passed, M failed".
// Assertions never stop the run: a failed one is counted and the story goes on, as the shell
// checks did.
type Suite struct {
	*Lab
	out      io.Writer
	timeline *os.File
	t0       time.Time

	Passed, Failed int
	Fails          []string

	// Out and RC are the last guest command's output and exit status (Run, T).
	Out string
	RC  int

	steps  []stepTime
	step   string
	stepT0 time.Time
	inStep bool

	results string // where the results are kept ("" for nowhere)
	saveErr error
}

type stepTime struct {
	name   string
	secs   float64
	result string
}

// NewSuite starts a run's assertions on lab, printing to out and logging to the lab's
// logs/timeline.txt.
func NewSuite(lab *Lab, out io.Writer) *Suite {
	s := &Suite{Lab: lab, out: out, t0: time.Now()}
	if f, err := os.OpenFile(filepath.Join(lab.Dir, "logs", "timeline.txt"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		s.timeline = f
	}
	return s
}

// Logf prints a progress line with the run's wall time (stderr and the timeline).
func (s *Suite) Logf(format string, args ...any) {
	line := fmt.Sprintf("[%6.1fs] %s\n", time.Since(s.t0).Seconds(), fmt.Sprintf(format, args...))
	fmt.Fprint(os.Stderr, line)
	if s.timeline != nil {
		_, _ = s.timeline.WriteString(line)
	}
}

// Step closes the current step (ok) and starts another.
func (s *Suite) Step(name string) {
	s.StepDone()
	s.step, s.stepT0, s.inStep = name, time.Now(), true
	s.Logf("── %s", name)
}

// StepDone closes the current step with result ok.
func (s *Suite) StepDone() { s.StepEnd("ok") }

// StepEnd closes the current step with result.
func (s *Suite) StepEnd(result string) {
	if !s.inStep {
		return
	}
	s.steps = append(s.steps, stepTime{s.step, time.Since(s.stepT0).Seconds(), result})
	s.inStep = false
}

// Pass counts a passed assertion.
func (s *Suite) Pass(name string) {
	s.Passed++
	fmt.Fprintf(s.out, "PASS: %s\n", name)
	s.save(false)
}

// Fail counts a failed assertion and prints what it saw (the last 30 lines of details).
func (s *Suite) Fail(name string, details ...string) {
	s.Failed++
	s.Fails = append(s.Fails, name)
	defer s.save(false)
	fmt.Fprintf(s.out, "FAIL: %s\n", name)
	lines := strings.Split(strings.TrimRight(strings.Join(details, "\n"), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	for _, ln := range lines {
		if len(details) > 0 {
			fmt.Fprintf(s.out, "      | %s\n", ln)
		}
	}
}

// Run runs script on node and keeps its output and status in Out and RC.
func (s *Suite) Run(node, script string) (string, int) {
	s.Out, s.RC = s.On(node, script)
	return s.Out, s.RC
}

// T checks that script, run on node, exits with want (its output in Out).
func (s *Suite) T(want int, name, node, script string) bool {
	return s.TT(s.CmdTimeout, want, name, node, script)
}

// TT is T with its own deadline for the command.
func (s *Suite) TT(timeout time.Duration, want int, name, node, script string) bool {
	s.Out, s.RC = s.OnT(timeout, node, script)
	if s.RC == want {
		s.Pass(name)
		return true
	}
	s.Fail(name, fmt.Sprintf("exit %d, want %d; output:", s.RC, want), s.Out)
	return false
}

// Check checks that pred holds now (nil). Its error says what it saw.
func (s *Suite) Check(name string, pred func() error) bool {
	if err := pred(); err != nil {
		s.Fail(name, err.Error())
		return false
	}
	s.Pass(name)
	return true
}

// CheckWithin checks that pred comes to hold within d, tried every 0.2 s.
func (s *Suite) CheckWithin(d time.Duration, name string, pred func() error) bool {
	err := Within(d, pred)
	if err != nil {
		s.Fail(name, fmt.Sprintf("not true within %s: %v", d, err))
		return false
	}
	s.Pass(name)
	return true
}

// Within tries pred every 0.2 s until it holds (nil) or d has passed (its last error).
func Within(d time.Duration, pred func() error) error {
	end := time.Now().Add(d)
	for {
		err := pred()
		if err == nil {
			return nil
		}
		if time.Now().After(end) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitFor lets d of this host's clock pass (a lease window to wait out).
func WaitFor(d time.Duration) { time.Sleep(d) }

// Cond is nil when ok, else an error saying what was seen.
func Cond(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// OutHas checks that the last command's output holds sub, ignoring case.
func (s *Suite) OutHas(sub string) func() error {
	out := s.Out
	return func() error {
		return Cond(strings.Contains(strings.ToLower(out), strings.ToLower(sub)), "output does not say %q: %s", sub, out)
	}
}

// OutHasNot checks that the last command's output does not hold sub, ignoring case.
func (s *Suite) OutHasNot(sub string) func() error {
	out := s.Out
	return func() error {
		return Cond(!strings.Contains(strings.ToLower(out), strings.ToLower(sub)), "output says %q: %s", sub, out)
	}
}

// JSON decodes the last command's output into v.
func (s *Suite) JSON(v any) error {
	if err := json.Unmarshal([]byte(s.Out), v); err != nil {
		return fmt.Errorf("not the JSON expected: %w: %s", err, s.Out)
	}
	return nil
}

// Close ends the current step and prints the steps' table, the failed assertions' names and the
// closing line "N passed, M failed".
func (s *Suite) Close(name string) {
	s.StepDone()
	fmt.Fprintf(s.out, "\n%s steps:\n", name)
	fmt.Fprintf(s.out, "  %-78s %8s  %s\n", "STEP", "SECONDS", "RESULT")
	for _, st := range s.steps {
		fmt.Fprintf(s.out, "  %-78s %8.1f  %s\n", st.name, st.secs, st.result)
	}
	fmt.Fprintf(s.out, "  %-78s %8.1f\n", "total wall time", time.Since(s.t0).Seconds())
	for _, f := range s.Fails {
		fmt.Fprintf(s.out, "failed: %s\n", f)
	}
	fmt.Fprintf(s.out, "%d passed, %d failed\n", s.Passed, s.Failed)
	if s.timeline != nil {
		_ = s.timeline.Close()
	}
}

// KeepResults has the run's counts, failed names and steps written to path as JSON after every
// assertion and step ("done": false until Finish): what tests/lab/e2e's closing line counts.
func (s *Suite) KeepResults(path string) { s.results = path }

// Finish ends the current step and writes the results as done.
func (s *Suite) Finish() error {
	s.StepDone()
	s.save(true)
	return s.saveErr
}

// save writes the results (to a temporary file renamed into place: a reader never sees half of
// them); the first error is kept for Finish.
func (s *Suite) save(done bool) {
	if s.results == "" {
		return
	}
	type step struct {
		Name    string  `json:"name"`
		Seconds float64 `json:"seconds"`
		Result  string  `json:"result"`
	}
	r := struct {
		Passed int      `json:"passed"`
		Failed int      `json:"failed"`
		Fails  []string `json:"fails"`
		Steps  []step   `json:"steps"`
		Done   bool     `json:"done"`
	}{Passed: s.Passed, Failed: s.Failed, Fails: s.Fails, Done: done}
	for _, st := range s.steps {
		r.Steps = append(r.Steps, step{st.name, st.secs, st.result})
	}
	if s.inStep {
		r.Steps = append(r.Steps, step{s.step, time.Since(s.stepT0).Seconds(), "unfinished"})
	}
	b, err := json.Marshal(r)
	if err == nil {
		tmp := s.results + ".tmp"
		if err = os.WriteFile(tmp, b, 0o644); err == nil {
			err = os.Rename(tmp, s.results)
		}
	}
	if err != nil && s.saveErr == nil {
		s.saveErr = err
		s.Logf("results: %v", err)
	}
}
