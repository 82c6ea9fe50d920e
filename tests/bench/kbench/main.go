// Command kbench runs one of the benchmark's measurements inside a lab guest and prints one
// JSON line per measured operation ({"what","op","ms","err"}), which tests/bench/run tabulates.
//
//	kbench raw    -n 30 -image bench1            the kernel floor: a prepared add string written to
//	                                             add_single_major (key already in the keyring,
//	                                             noshare) until /dev/rbdN exists, then remove
//	kbench rbd    -n 30 -image bench1            Ceph's `rbd device map` / `rbd device unmap`
//	kbench cli    -n 30 -image bench1            `rbd-owner map` / `rbd-owner unmap`
//	kbench api    -n 30 -image bench1            the agent's API from one long-lived client
//	    (rbd, cli, api: -noudev maps without waiting for udevd, as `rbd map -o noudev`, what
//	    ceph-csi runs; the measurement is then named rbd-noudev, cli-noudev, api-noudev)
//	kbench seq    -n 30 -image bench1 -modes raw,rbd,rbd-noudev,cli,cli-noudev,api,api-noudev
//	                                             the same measurements interleaved: run i maps and
//	                                             unmaps once in each mode before run i+1, so a
//	                                             machine whose load changes meanwhile slows every
//	                                             mode alike (what tests/bench/run uses)
//	kbench par    -n 64 -prefix par -via api|rbd  n images mapped at once, then unmapped at once
//	kbench clients -n 64 -prefix par -share      n raw maps with or without noshare: slab, TCP
//	                                             connections to the cluster, map latency
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/agent/krbd"
)

var (
	n       = flag.Int("n", 30, "runs (or images for par and clients)")
	img     = flag.String("image", "bench1", "image in pool rbd")
	prefix  = flag.String("prefix", "par", "image name prefix for par and clients (prefix1..prefixN)")
	via     = flag.String("via", "api", "par: api or rbd")
	share   = flag.Bool("share", false, "clients: map without noshare (one shared kernel client)")
	keep    = flag.Bool("keep", false, "par: leave the images mapped (no unmap phase)")
	noudev  = flag.Bool("noudev", false, "rbd, cli, api, par: map without waiting for udevd (rbd's -o noudev)")
	modes   = flag.String("modes", "raw,rbd,rbd-noudev,cli,cli-noudev,api,api-noudev", "seq: the modes, interleaved")
	only    = flag.String("only", "", "par: run only this phase (map or unmap)")
	mon     = flag.String("mon", "203.0.113.1:6789", "monitor")
	user    = flag.String("user", "rbdowner", "cephx user")
	keyring = flag.String("keyring", "/etc/ceph/ceph.client.rbdowner.keyring", "keyring")
	socket  = flag.String("socket", api.DefaultSocket, "agent socket")
)

type result struct {
	What string  `json:"what"`
	Op   string  `json:"op"`
	Ms   float64 `json:"ms"`
	Err  string  `json:"err,omitempty"`
	// extra facts (clients)
	Value float64 `json:"value,omitempty"`
}

var outMu sync.Mutex

func emit(r result) {
	outMu.Lock()
	defer outMu.Unlock()
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// firstLines keeps an error short: its first 3 lines (a crashed rbd prints a whole dump).
func firstLines(s string) string {
	lines := strings.SplitN(s, "\n", 4)
	if len(lines) > 3 {
		lines = append(lines[:3], "…")
	}
	return strings.Join(lines, "\n")
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kbench raw|rbd|cli|api|par|clients [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	var err error
	switch mode {
	case "raw", "rbd", "cli", "api":
		name := mode
		if *noudev {
			name += "-noudev"
		}
		err = repeat(*n, name)
	case "seq":
		err = benchSeq()
	case "par":
		err = benchPar()
	case "clients":
		err = benchClients()
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kbench:", err)
		os.Exit(1)
	}
}

// one maps and unmaps bench's image once in the measurement name (raw, rbd, rbd-noudev, cli,
// cli-noudev, api, api-noudev) and emits both times.
type one func() error

func measurements() (map[string]one, error) {
	raw, err := newRawKernel()
	if err != nil {
		return nil, err
	}
	c := client.New(*socket)
	spec := "rbd/" + *img
	cmd := func(name string, mapArgv []string, unmapArgv func(dev string) []string) one {
		return func() error {
			dev, d, err := run(mapArgv)
			if err != nil {
				return err
			}
			emit(result{What: name, Op: "map", Ms: ms(d)})
			if _, d, err = run(unmapArgv(dev)); err != nil {
				return err
			}
			emit(result{What: name, Op: "unmap", Ms: ms(d)})
			return nil
		}
	}
	rbdMap := func(opts ...string) []string {
		return append(append([]string{"rbd", "--id", *user, "device", "map"}, opts...), spec)
	}
	rbdUnmap := func(opts ...string) func(string) []string {
		return func(dev string) []string {
			return append(append([]string{"rbd", "--id", *user, "device", "unmap"}, opts...), dev)
		}
	}
	cliUnmap := func(string) []string { return []string{"rbd-owner", "unmap", spec} }
	viaAPI := func(name string, noudev bool) one {
		return func() error {
			req := api.MapRequest{Pool: "rbd", Image: *img, Requester: "kbench " + name}
			if noudev {
				req.Options = []string{"noudev"}
			}
			start := time.Now()
			if _, err := c.Map(context.Background(), req); err != nil {
				return err
			}
			emit(result{What: name, Op: "map", Ms: ms(time.Since(start))})
			start = time.Now()
			if _, err := c.Unmap(context.Background(), api.UnmapRequest{Pool: "rbd", Image: *img}); err != nil {
				return err
			}
			emit(result{What: name, Op: "unmap", Ms: ms(time.Since(start))})
			return nil
		}
	}
	return map[string]one{
		"raw":        func() error { return raw.once(*img) },
		"rbd":        cmd("rbd", rbdMap(), rbdUnmap()),
		"rbd-noudev": cmd("rbd-noudev", rbdMap("--options", "noudev"), rbdUnmap("--options", "noudev")),
		"cli":        cmd("cli", []string{"rbd-owner", "map", spec}, cliUnmap),
		"cli-noudev": cmd("cli-noudev", []string{"rbd-owner", "map", "--no-udev", spec}, cliUnmap),
		"api":        viaAPI("api", false),
		"api-noudev": viaAPI("api-noudev", true),
	}, nil
}

// repeat runs measurement name n times.
func repeat(n int, name string) error {
	runtime.LockOSThread() // raw: the process keyring is what the kernel searches; one thread anyway
	all, err := measurements()
	if err != nil {
		return err
	}
	f, ok := all[name]
	if !ok {
		return fmt.Errorf("no measurement %q", name)
	}
	for i := 0; i < n; i++ {
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// benchSeq runs -modes interleaved, n rounds.
func benchSeq() error {
	runtime.LockOSThread()
	all, err := measurements()
	if err != nil {
		return err
	}
	names := strings.Split(*modes, ",")
	for _, m := range names {
		if all[m] == nil {
			return fmt.Errorf("no measurement %q", m)
		}
	}
	for i := 0; i < *n; i++ {
		for _, m := range names {
			if err := all[m](); err != nil {
				return fmt.Errorf("%s, round %d: %w", m, i+1, err)
			}
		}
	}
	return nil
}

// rawKernel maps with one prepared add string per image, the key added to the keyring once.
type rawKernel struct{ keyName string }

func newRawKernel() (*rawKernel, error) {
	// the "ceph" key type exists once libceph is loaded (on a fresh boot nothing has mapped yet)
	if out, err := exec.Command("modprobe", "rbd").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("modprobe rbd: %w: %s", err, out)
	}
	secret, err := krbd.ReadKeyringFile(*keyring, "client."+*user)
	if err != nil {
		return nil, err
	}
	payload, err := krbd.DecodeSecret(secret)
	if err != nil {
		return nil, err
	}
	k := &rawKernel{keyName: "kbench." + strconv.Itoa(os.Getpid())}
	if err := (krbd.KernelKeyring{}).AddCephKey(k.keyName, payload); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *rawKernel) add(image string, noshare bool) string {
	opts := "name=" + *user + ",key=" + k.keyName
	if noshare {
		opts += ",noshare"
	}
	return *mon + " " + opts + " rbd " + image + " -"
}

func ids() map[string]bool {
	ents, _ := os.ReadDir("/sys/bus/rbd/devices")
	m := map[string]bool{}
	for _, e := range ents {
		m[e.Name()] = true
	}
	return m
}

// mapRaw writes the add string and waits for the new device's /dev node; it returns the id.
func (k *rawKernel) mapRaw(image string, noshare bool) (string, time.Duration, error) {
	before := ids()
	start := time.Now()
	if err := os.WriteFile("/sys/bus/rbd/add_single_major", []byte(k.add(image, noshare)), 0); err != nil {
		return "", 0, err
	}
	for {
		for id := range ids() {
			if before[id] {
				continue
			}
			if name, _ := os.ReadFile("/sys/bus/rbd/devices/" + id + "/name"); strings.TrimSpace(string(name)) != image {
				continue
			}
			if _, err := os.Stat("/dev/rbd" + id); err == nil {
				return id, time.Since(start), nil
			}
		}
		if time.Since(start) > time.Minute {
			return "", 0, errors.New("the device did not appear in a minute")
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func unmapRaw(id string) (time.Duration, error) {
	start := time.Now()
	for {
		// udev's probe of a new device holds it open for a moment: the kernel says EBUSY, and
		// Ceph's rbd and the agent retry too
		err := os.WriteFile("/sys/bus/rbd/remove_single_major", []byte(id), 0)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EBUSY) || time.Since(start) > 10*time.Second {
			return 0, err
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		if _, err := os.Stat(filepath.Join("/sys/bus/rbd/devices", id)); err != nil {
			return time.Since(start), nil
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// once maps image raw (noshare) and unmaps it, and emits both times.
func (k *rawKernel) once(image string) error {
	id, d, err := k.mapRaw(image, true)
	if err != nil {
		return err
	}
	emit(result{What: "raw", Op: "map", Ms: ms(d)})
	if d, err = unmapRaw(id); err != nil {
		return err
	}
	emit(result{What: "raw", Op: "unmap", Ms: ms(d)})
	return nil
}

func run(argv []string) (string, time.Duration, error) {
	start := time.Now()
	cmd := exec.Command(argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output() // stdout alone: the device path (warnings go to stderr)
	d := time.Since(start)
	if err != nil {
		return "", d, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), d, nil
}

// mapRequest is the API's map of image, with noudev when -noudev says so.
func mapRequest(image string) api.MapRequest {
	r := api.MapRequest{Pool: "rbd", Image: image, Requester: "kbench par"}
	if *noudev {
		r.Options = []string{"noudev"}
	}
	return r
}

// benchPar maps n images at once (through the API from one client, or n `rbd device map`),
// then unmaps them at once.
func benchPar() error {
	c := client.New(*socket)
	ctx := context.Background()
	devs := make([]string, *n)
	label := "par-" + *via
	var rbdOpts []string
	if *noudev {
		label, rbdOpts = label+"-noudev", []string{"--options", "noudev"}
	}
	phase := func(op string, f func(i int) error) {
		var wg sync.WaitGroup
		start := time.Now()
		for i := 0; i < *n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.Now()
				err := f(i)
				r := result{What: label, Op: op, Ms: ms(time.Since(t))}
				if err != nil {
					r.Err = firstLines(err.Error())
				}
				emit(r)
			}()
		}
		wg.Wait()
		emit(result{What: label, Op: op + "-all", Ms: ms(time.Since(start))})
	}
	image := func(i int) string { return *prefix + strconv.Itoa(i+1) }
	if *only != "unmap" {
		phase("map", func(i int) error {
			if *via == "rbd" {
				dev, _, err := run(append([]string{"rbd", "--id", *user, "device", "map"}, append(rbdOpts, "rbd/"+image(i))...))
				devs[i] = dev
				return err
			}
			r, err := c.Map(ctx, mapRequest(image(i)))
			if err == nil {
				devs[i] = r.Device
			}
			return err
		})
	}
	if *keep || *only == "map" {
		return nil
	}
	phase("unmap", func(i int) error {
		if *via == "rbd" {
			if devs[i] == "" {
				return nil
			}
			_, _, err := run([]string{"rbd", "--id", *user, "device", "unmap", devs[i]})
			return err
		}
		_, err := c.Unmap(ctx, api.UnmapRequest{Pool: "rbd", Image: image(i)})
		return err
	})
	return nil
}

// benchClients maps n images raw, one after the other, with a kernel client each (noshare) or
// one shared client, and reports the slab and the TCP connections they hold, then unmaps them.
func benchClients() error {
	runtime.LockOSThread()
	k, err := newRawKernel()
	if err != nil {
		return err
	}
	what := "clients-noshare"
	if *share {
		what = "clients-shared"
	}
	slab0, conns0 := slabKB(), tcpConns()
	var made []string
	for i := 0; i < *n; i++ {
		id, d, err := k.mapRaw(*prefix+strconv.Itoa(i+1), !*share)
		if err != nil {
			return err
		}
		made = append(made, id)
		emit(result{What: what, Op: "map", Ms: ms(d)})
	}
	time.Sleep(2 * time.Second) // let the clients open their OSD sessions
	emit(result{What: what, Op: "slab-kb", Value: slabKB() - slab0})
	emit(result{What: what, Op: "tcp-conns", Value: tcpConns() - conns0})
	for _, id := range made {
		d, err := unmapRaw(id)
		if err != nil {
			return err
		}
		emit(result{What: what, Op: "unmap", Ms: ms(d)})
	}
	return nil
}

func slabKB() float64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Slab:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// tcpConns counts established TCP connections (state 01) from /proc/net/tcp.
func tcpConns() float64 {
	b, _ := os.ReadFile("/proc/net/tcp")
	c := 0
	for _, l := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(l); len(f) > 3 && f[3] == "01" {
			c++
		}
	}
	return float64(c)
}
