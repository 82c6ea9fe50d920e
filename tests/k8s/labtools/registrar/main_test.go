package main

import (
	"context"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// identity is a CSI driver that only says its name.
type identity struct {
	csi.UnimplementedIdentityServer
	name string
}

func (i identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.name, VendorVersion: "v0"}, nil
}

func startDriver(t *testing.T, dir, name string) string {
	t.Helper()
	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	csi.RegisterIdentityServer(s, identity{name: name})
	go s.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(s.Stop)
	return sock
}

type result struct{ err error }

func start(t *testing.T, o options) (context.CancelFunc, <-chan result) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() { done <- result{run(ctx, o, log.New(io.Discard, "", 0))} }()
	t.Cleanup(cancel)
	return cancel, done
}

// kubelet dials the registration socket as the kubelet's plugin watcher does, once it is one.
func kubelet(t *testing.T, sock string, done <-chan result) registration.RegistrationClient {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode().Type() == os.ModeSocket {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("registrar ended before it listened: %v", r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no registration socket %s", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return registration.NewRegistrationClient(conn)
}

func TestRegistersTheDriverAsTheKubeletAsks(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "registry")
	if err := os.Mkdir(reg, 0o755); err != nil {
		t.Fatal(err)
	}
	// a socket left by an earlier container is replaced
	stale := filepath.Join(reg, "rbd.csi.ceph.com-reg.sock")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o := options{csiAddress: "unix://" + startDriver(t, dir, "rbd.csi.ceph.com"), kubeletPath: "/var/lib/kubelet/plugins/rbd.csi.ceph.com/csi.sock",
		registrationDir: reg, connectTimeout: 10 * time.Second, supportedVersions: []string{"1.0.0"}}
	cancel, done := start(t, o)
	k := kubelet(t, stale, done)
	info, err := k.GetInfo(context.Background(), &registration.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registration.CSIPlugin || info.Name != "rbd.csi.ceph.com" || info.Endpoint != o.kubeletPath || len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" {
		t.Fatalf("GetInfo: %+v", info)
	}
	if _, err := k.NotifyRegistrationStatus(context.Background(), &registration.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("ended on SIGTERM with %v, want nil", r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("registrar did not end when told to")
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("registration socket left behind: %v", err)
	}
}

func TestARefusedRegistrationEndsIt(t *testing.T) {
	dir := t.TempDir()
	o := options{csiAddress: startDriver(t, dir, "rbd.csi.ceph.com"), kubeletPath: "/k/csi.sock", registrationDir: dir, connectTimeout: 10 * time.Second}
	_, done := start(t, o)
	k := kubelet(t, filepath.Join(dir, "rbd.csi.ceph.com-reg.sock"), done)
	if _, err := k.NotifyRegistrationStatus(context.Background(), &registration.RegistrationStatus{PluginRegistered: false, Error: "version 9 not supported"}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err == nil || !strings.Contains(r.err.Error(), "version 9 not supported") {
			t.Fatalf("ended with %v, want the kubelet's refusal", r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a refused registration did not end the registrar")
	}
}

func TestADriverThatNeverAnswersIsAnError(t *testing.T) {
	dir := t.TempDir()
	o := options{csiAddress: filepath.Join(dir, "nothing.sock"), kubeletPath: "/k/csi.sock", registrationDir: dir, connectTimeout: 1500 * time.Millisecond}
	_, done := start(t, o)
	select {
	case r := <-done:
		if r.err == nil || !strings.Contains(r.err.Error(), "did not answer GetPluginInfo") {
			t.Fatalf("ended with %v, want a clear error", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("it waited past its timeout")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}
