// Command registrar registers a CSI driver with the kubelet's plugin watcher, as
// node-driver-registrar does, in that container's slot of ceph-csi's node plugin DaemonSet and
// with its flags (--csi-address, --kubelet-registration-path, --plugin-registration-path, --v):
// the Kubernetes lab builds its images from Go modules, and node-driver-registrar is not among
// those it can fetch.
//
// It asks the driver its name (CSI GetPluginInfo on --csi-address), serves the kubelet's
// Registration API on <plugin-registration-path>/<name>-reg.sock, and answers GetInfo with the
// driver's socket as the kubelet sees it (--kubelet-registration-path). A registration the
// kubelet reports failed ends it with an error, so that the container restarts and registers
// again; SIGTERM or SIGINT removes its socket and ends it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// options are the flags, node-driver-registrar's names.
type options struct {
	csiAddress        string        // the driver's socket in this container
	kubeletPath       string        // the same socket as the kubelet sees it (on the host)
	registrationDir   string        // the kubelet's plugins_registry, mounted here
	connectTimeout    time.Duration // how long to wait for the driver's socket to answer
	supportedVersions []string
	verbosity         int
}

func main() {
	var o options
	flag.StringVar(&o.csiAddress, "csi-address", "/run/csi/socket", "the CSI driver's socket, in this container (unix path or unix:// URL)")
	flag.StringVar(&o.kubeletPath, "kubelet-registration-path", "", "the CSI driver's socket on the host, as the kubelet dials it (required)")
	flag.StringVar(&o.registrationDir, "plugin-registration-path", "/registration", "the kubelet's plugin registration directory, in this container")
	flag.DurationVar(&o.connectTimeout, "timeout", 5*time.Minute, "how long to wait for the CSI driver to answer GetPluginInfo")
	flag.IntVar(&o.verbosity, "v", 0, "log verbosity (1: log each kubelet call)")
	flag.Parse()
	o.supportedVersions = []string{"1.0.0"}
	if o.kubeletPath == "" {
		log.Fatal("registrar: --kubelet-registration-path is required: the driver's socket as the kubelet sees it, e.g. /var/lib/kubelet/plugins/rbd.csi.ceph.com/csi.sock")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, log.Default()); err != nil {
		log.Fatalf("registrar: %v", err)
	}
}

// run registers the driver and serves the kubelet until ctx ends (nil) or the kubelet reports
// the registration failed (an error).
func run(ctx context.Context, o options, logger *log.Logger) error {
	name, err := driverName(ctx, o.csiAddress, o.connectTimeout)
	if err != nil {
		return err
	}
	sock := filepath.Join(o.registrationDir, name+"-reg.sock")
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the stale registration socket %s: %w", sock, err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listening on %s (is the kubelet's plugins_registry mounted at %s?): %w", sock, o.registrationDir, err)
	}
	defer os.Remove(sock) //nolint:errcheck // best effort: a stale socket is removed at the next start
	failed := make(chan error, 1)
	srv := grpc.NewServer()
	registration.RegisterRegistrationServer(srv, &registrar{name: name, o: o, log: logger, failed: failed})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	logger.Printf("registrar: driver %s registered at %s (the kubelet dials %s)", name, sock, o.kubeletPath)
	var res error
	select {
	case <-ctx.Done():
	case res = <-failed:
	case res = <-served:
		res = fmt.Errorf("serving the kubelet on %s: %w", sock, res)
	}
	// let a call in flight (the kubelet's NotifyRegistrationStatus) have its answer, briefly
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	return res
}

// driverName asks the CSI driver at address its name, retrying until it answers or timeout.
func driverName(ctx context.Context, address string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target := address
	if !hasScheme(target) {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", fmt.Errorf("CSI driver at %s: %w", address, err)
	}
	defer conn.Close() //nolint:errcheck // a client connection: nothing to lose
	id := csi.NewIdentityClient(conn)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := id.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		ccancel()
		if err == nil && info.GetName() != "" {
			return info.GetName(), nil
		}
		if err == nil {
			err = errors.New("it answered GetPluginInfo with no name")
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("CSI driver at %s did not answer GetPluginInfo within %s: %w", address, timeout, err)
		case <-time.After(time.Second):
		}
	}
}

func hasScheme(a string) bool {
	for i := 0; i < len(a); i++ {
		switch c := a[i]; {
		case c == ':':
			return i > 0
		case c == '/':
			return false
		}
	}
	return false
}

// registrar is the kubelet's side of the conversation.
type registrar struct {
	registration.UnimplementedRegistrationServer
	name   string
	o      options
	log    *log.Logger
	failed chan<- error
}

func (r *registrar) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	if r.o.verbosity > 0 {
		r.log.Printf("registrar: the kubelet asked GetInfo")
	}
	return &registration.PluginInfo{Type: registration.CSIPlugin, Name: r.name, Endpoint: r.o.kubeletPath,
		SupportedVersions: r.o.supportedVersions}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		err := fmt.Errorf("the kubelet refused driver %s: %s; ending, so that the container restarts and registers again", r.name, s.Error)
		select {
		case r.failed <- err:
		default:
		}
		return &registration.RegistrationStatusResponse{}, nil
	}
	r.log.Printf("registrar: the kubelet registered driver %s", r.name)
	return &registration.RegistrationStatusResponse{}, nil
}
