// Command writer is the chaos campaign's workload, run in each lab guest: while its deadline
// has not passed it asks the node's agent for one of the campaign's images (map, with takeover
// once the holder's lease has expired, as a CSI plugin under churn would), writes 4 KiB blocks
// to it with O_DIRECT, each stamped with (node, claim epoch, sequence number, block, checksum),
// and logs every write it issued and every one the kernel acknowledged, then unmaps it. The log
// (on the host's share, flushed line by line) is what the checker holds the images against.
//
//	writer -node node-a -images chaos1,chaos2 -log /mnt/host/chaos/node-a.log -for 60s -seed 7
//
// With -hold it is a live holder instead, for the faults that must not fence a live node
// (idle-claim, slow-pool): it maps its one image once, without takeover (retrying while another
// node holds it), logs "hold node=… image=…", writes stamped blocks without a pause longer than
// a few hundred milliseconds until the -stop file appears (or the deadline passes), then unmaps.
// Every one of those writes must be acknowledged: the checker counts a failed write (or a failed
// open) of a hold as a fence of a live node.
//
//	writer -hold -node node-a -pool rbd -namespace chaosidle -images idle1-1-y -stop /mnt/host/chaos/stop-1 -log … -for 120s -seed 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rbd-owner/rbd-owner/agent/api"
	"github.com/rbd-owner/rbd-owner/agent/client"
	"github.com/rbd-owner/rbd-owner/tests/chaos/block"
)

func main() {
	node := flag.String("node", "", "this node's id")
	images := flag.String("images", "", "comma-separated images in pool rbd")
	logPath := flag.String("log", "", "log file")
	dur := flag.Duration("for", time.Minute, "how long to run")
	seed := flag.Uint64("seed", 1, "random seed")
	socket := flag.String("socket", api.DefaultSocket, "the agent's socket")
	pool := flag.String("pool", "rbd", "the images' pool")
	namespace := flag.String("namespace", "", "the images' RADOS namespace in the pool")
	hold := flag.Bool("hold", false, "hold the one image: map it once (no takeover), write until -stop appears, unmap")
	stop := flag.String("stop", "", "with -hold: stop writing once this file exists")
	flag.Parse()
	if *node == "" || *images == "" || *logPath == "" {
		fmt.Fprintln(os.Stderr, "writer: -node, -images and -log are required")
		os.Exit(2)
	}
	lf, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(1)
	}
	w := &writer{node: *node, pool: *pool, namespace: *namespace, images: strings.Split(*images, ","), log: lf, agent: client.New(*socket),
		rnd: rand.New(rand.NewPCG(*seed, uint64(len(*node))))}
	if *hold {
		w.hold(time.Now().Add(*dur), *stop)
		return
	}
	w.run(time.Now().Add(*dur))
}

type writer struct {
	node      string
	pool      string
	namespace string
	images    []string
	log       *os.File
	agent     *client.Client
	rnd       *rand.Rand
	seq       uint64
}

// logf writes one log line and flushes it to the host before going on.
func (w *writer) logf(format string, a ...any) {
	fmt.Fprintf(w.log, format+"\n", a...)
	_ = w.log.Sync()
}

func (w *writer) run(deadline time.Time) {
	w.logf("start node=%s", w.node)
	for time.Now().Before(deadline) {
		img := w.images[w.rnd.IntN(len(w.images))]
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		resp, err := w.agent.Map(ctx, api.MapRequest{Pool: w.pool, Namespace: w.namespace, Image: img, Takeover: true, Requester: "chaos-writer"})
		cancel()
		if err != nil {
			w.logf("refused image=%s code=%s", img, client.Code(err))
			time.Sleep(time.Duration(500+w.rnd.IntN(1500)) * time.Millisecond)
			continue
		}
		epoch := w.epochOf(resp)
		addr := clientAddr(resp.Device)
		w.logf("mapped image=%s device=%s epoch=%d addr=%s", img, resp.Device, epoch, addr)
		w.writeSome(img, resp.Device, epoch)
		ctx, cancel = context.WithTimeout(context.Background(), 90*time.Second)
		_, err = w.agent.Unmap(ctx, api.UnmapRequest{Pool: w.pool, Namespace: w.namespace, Image: img, Force: true})
		cancel()
		w.logf("unmapped image=%s err=%v", img, err)
	}
	w.logf("done node=%s", w.node)
}

// epochOf is this node's epoch in a map reply's claim (0 when it is not there).
func (w *writer) epochOf(resp *api.MapResponse) uint64 {
	if resp.Claim != nil {
		for _, h := range resp.Claim.Holders {
			if h.NodeID == w.node {
				return h.Epoch
			}
		}
	}
	return 0
}

// hold maps the one image (no takeover; a refusal is retried every 50 ms until the deadline),
// then writes until stop exists or the deadline passes, stopping at the first failed write, and
// unmaps. Lines: "refused …" while another node holds it, "hold node=… image=…" and "mapped …"
// once mapped, issue/ack/fail as in run, "hold-end node=… image=… writes=N failed=F", "unmapped
// …", "done …"; "hold-unmapped …" when it never got the image.
func (w *writer) hold(deadline time.Time, stop string) {
	img := w.images[0]
	w.logf("start node=%s hold=%s", w.node, img)
	var resp *api.MapResponse
	for refused := 0; ; refused++ {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		r, err := w.agent.Map(ctx, api.MapRequest{Pool: w.pool, Namespace: w.namespace, Image: img, Requester: "chaos-writer"})
		cancel()
		if err == nil {
			resp = r
			break
		}
		if refused < 3 || refused%20 == 0 {
			w.logf("refused image=%s code=%s n=%d", img, client.Code(err), refused+1)
		}
		if time.Now().After(deadline) || (stop != "" && exists(stop)) {
			w.logf("hold-unmapped node=%s image=%s refused=%d", w.node, img, refused+1)
			w.logf("done node=%s", w.node)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	epoch := w.epochOf(resp)
	w.logf("hold node=%s image=%s epoch=%d", w.node, img, epoch)
	w.logf("mapped image=%s device=%s epoch=%d addr=%s", img, resp.Device, epoch, clientAddr(resp.Device))
	n, failed := 0, 0
	fd, err := unix.Open(resp.Device, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		w.logf("open-failed image=%s err=%v", img, err)
		failed = 1
	} else {
		buf, err := unix.Mmap(-1, 0, block.Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			w.logf("mmap-failed err=%v", err)
			failed = 1
		}
		for err == nil && time.Now().Before(deadline) && !(stop != "" && exists(stop)) {
			b := uint64(w.rnd.IntN(block.Count))
			w.seq++
			s := block.Stamp{Node: w.node, Image: img, Epoch: epoch, Seq: w.seq, Block: b}
			s.Fill(buf)
			w.logf("issue %s", s)
			if _, werr := unix.Pwrite(fd, buf, int64(b)*block.Size); werr != nil {
				w.logf("fail %s err=%v", s, errors.Unwrap(werr))
				failed++
				break
			}
			n++
			w.logf("ack %s", s)
			time.Sleep(time.Duration(50+w.rnd.IntN(100)) * time.Millisecond)
		}
		if buf != nil {
			_ = unix.Munmap(buf)
		}
		unix.Close(fd)
	}
	w.logf("hold-end node=%s image=%s writes=%d failed=%d", w.node, img, n, failed)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	_, err = w.agent.Unmap(ctx, api.UnmapRequest{Pool: w.pool, Namespace: w.namespace, Image: img, Force: true})
	cancel()
	w.logf("unmapped image=%s err=%v", img, err)
	w.logf("done node=%s", w.node)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeSome writes a burst of stamped blocks; it stops at the first failed write (fenced,
// unmapped behind its back).
func (w *writer) writeSome(img, dev string, epoch uint64) {
	fd, err := unix.Open(dev, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		w.logf("open-failed image=%s err=%v", img, err)
		return
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, block.Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE) // page-aligned for O_DIRECT
	if err != nil {
		w.logf("mmap-failed err=%v", err)
		return
	}
	defer unix.Munmap(buf)
	n := 10 + w.rnd.IntN(30)
	for i := 0; i < n; i++ {
		b := uint64(w.rnd.IntN(block.Count))
		w.seq++
		s := block.Stamp{Node: w.node, Image: img, Epoch: epoch, Seq: w.seq, Block: b}
		s.Fill(buf)
		w.logf("issue %s", s)
		_, err := unix.Pwrite(fd, buf, int64(b)*block.Size)
		if err != nil {
			w.logf("fail %s err=%v", s, errors.Unwrap(err))
			return
		}
		w.logf("ack %s", s)
		time.Sleep(time.Duration(50+w.rnd.IntN(150)) * time.Millisecond)
	}
}

// clientAddr is the mapping's kernel client address (from sysfs), "" when unknown.
func clientAddr(dev string) string {
	id := strings.TrimPrefix(dev, "/dev/rbd")
	b, err := os.ReadFile("/sys/bus/rbd/devices/" + id + "/client_addr")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
