// Command rbd-owner-failover is the optional failover controller for Kubernetes (issue 53;
// docs/kubernetes.md, "Automatic failover"): run as a Deployment of two replicas with leader
// election, it declares a node dead only when its kubelet lease and its rbd-owner heartbeats
// have both stopped for a grace, fences the node's holds with its own cephx user, reads the
// entries back, and only then taints the node out-of-service, force-deletes its pods that use a
// volume it held and deletes those VolumeAttachments, so that Kubernetes starts the pods on
// another node at once. It lifts what it did when the node comes back.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	kevents "k8s.io/client-go/tools/record"

	"github.com/rbd-owner/rbd-owner/agent/cephconn"
	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/failover"
	"github.com/rbd-owner/rbd-owner/agent/failoverctl"
	"github.com/rbd-owner/rbd-owner/agent/version"
)

type options struct {
	kubeconfig, namespace, leaseName, identity, driver, metrics string
	user, keyring, conf, monitors                               string
	dryRun                                                      bool
	interval, fenceExpiry                                       time.Duration
	decide                                                      failover.Config
}

func parse(args []string) (*options, error) {
	o := &options{decide: failover.Defaults}
	fs := flag.NewFlagSet("rbd-owner-failover", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "a kubeconfig (default: the pod's service account)")
	fs.StringVar(&o.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the namespace of the leader election's Lease (default $POD_NAMESPACE)")
	fs.StringVar(&o.leaseName, "lease-name", "rbd-owner-failover", "the leader election's Lease")
	fs.StringVar(&o.identity, "identity", os.Getenv("POD_NAME"), "this replica's name in the election, events and states (default $POD_NAME, else the host name)")
	fs.StringVar(&o.driver, "driver", "rbd.csi.ceph.com", "the CSI driver whose volumes the rbd-owner agents hold")
	fs.StringVar(&o.metrics, "metrics-address", ":9284", "where /metrics and /healthz are served (empty: not served)")
	fs.StringVar(&o.user, "ceph-user", "rbd-owner-failover", "the controller's own cephx id, without \"client.\"")
	fs.StringVar(&o.keyring, "ceph-keyring", "/etc/rbd-owner-failover/keyring", "the keyring holding that user's key")
	fs.StringVar(&o.conf, "ceph-conf", "", "a ceph.conf (optional when --ceph-monitors is given)")
	fs.StringVar(&o.monitors, "ceph-monitors", "", "the monitors, comma-separated host:port")
	fs.BoolVar(&o.dryRun, "dry-run", false, "decide and report (events, log, metrics), change nothing")
	fs.DurationVar(&o.interval, "interval", 5*time.Second, "time between rounds")
	fs.DurationVar(&o.fenceExpiry, "fence-expiry", claim.DefaultFenceExpiry, "how long a fence's blocklist entry is listed for (the agents' fence_expiry)")
	fs.DurationVar(&o.decide.KubeletGrace, "kubelet-grace", failover.Defaults.KubeletGrace, "how long a node's kubelet lease must be seen unchanged")
	fs.DurationVar(&o.decide.AgentGrace, "agent-grace", failover.Defaults.AgentGrace, "how long a node's rbd-owner heartbeats must be seen unchanged, in every place")
	fs.IntVar(&o.decide.MaxNodes, "max-nodes", failover.Defaults.MaxNodes, "at most this many nodes declared dead within --window")
	fs.Float64Var(&o.decide.MaxFraction, "max-fraction", failover.Defaults.MaxFraction, "and at most this fraction of the cluster's nodes (0: no fraction)")
	fs.DurationVar(&o.decide.Window, "window", failover.Defaults.Window, "the window of --max-nodes and --max-fraction")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := o.decide.Validate(); err != nil {
		return nil, err
	}
	if o.namespace == "" {
		return nil, errors.New("no namespace for the leader election's Lease: give --namespace or set POD_NAMESPACE")
	}
	if o.identity == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("no --identity and no host name: %w", err)
		}
		o.identity = h
	}
	return o, nil
}

func main() {
	log := logrus.New()
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	o, err := parse(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		log.Errorf("rbd-owner-failover: %v", err)
		os.Exit(2)
	}
	if err := run(o, log); err != nil {
		log.Errorf("rbd-owner-failover: %v", err)
		os.Exit(1)
	}
}

func run(o *options, log *logrus.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rc, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	copts := cephconn.Options{User: o.user, Keyring: o.keyring, ConfFile: o.conf}
	if o.monitors != "" {
		copts.Monitors = strings.Split(o.monitors, ",")
	}
	conn, err := cephconn.Connect(copts)
	if err != nil {
		return fmt.Errorf("%w (the controller's cephx user needs mon 'profile rbd, allow command \"osd blocklist\"', osd 'profile rbd')", err)
	}
	defer conn.Shutdown()
	store, err := claim.NewStore(conn, claim.Config{Node: claim.Node{ID: "failover-controller/" + o.identity, AgentVersion: version.Version}, FenceExpiry: o.fenceExpiry})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	metrics := failoverctl.NewMetrics(reg)
	if o.metrics != "" {
		srv := &http.Server{Addr: o.metrics, Handler: mux(reg), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.WithError(err).Error("rbd-owner-failover: metrics server stopped")
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	bc := kevents.NewBroadcaster()
	defer bc.Shutdown()
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	rec := bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "rbd-owner-failover", Host: o.identity})
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Name: o.leaseName, Namespace: o.namespace}, Client: kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.identity, EventRecorder: rec}}
	log.WithField("identity", o.identity).WithField("dry_run", o.dryRun).Infof("rbd-owner-failover %s: standing for leader (lease %s/%s)", version.Version, o.namespace, o.leaseName)
	// the controller takes a step only while its own lease was renewed within the renew
	// deadline, judged on its clock: a leader stopped past that (the standby may lead by the
	// lease's end) does nothing more, even before its election notices
	const leaseDuration, renewDeadline = 15 * time.Second, 10 * time.Second
	var le *leaderelection.LeaderElector
	leading := func() bool { return le.IsLeader() && le.Check(renewDeadline-leaseDuration) == nil }
	le, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: o.leaseName,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: 2 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				// a new controller each time: what a former leadership saw is not trusted
				c, err := failoverctl.New(failoverctl.Config{Decide: o.decide, Identity: o.identity, Driver: o.driver, DryRun: o.dryRun, Interval: o.interval,
					Log: log.WithField("identity", o.identity), Events: rec, Metrics: metrics, Leading: leading}, kube, failoverctl.StoreCluster{Store: store})
				if err != nil {
					log.WithError(err).Error("rbd-owner-failover: cannot start")
					stop()
					return
				}
				log.Info("rbd-owner-failover: leading: every node is watched from now, a whole grace before any is declared dead")
				c.Run(lctx)
			},
			OnStoppedLeading: func() { log.Warn("rbd-owner-failover: no longer leading") },
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	le.Run(ctx)
	return nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("not in a pod and no --kubeconfig: %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", kubeconfig, err)
	}
	return rc, nil
}

func mux(reg *prometheus.Registry) http.Handler {
	m := http.NewServeMux()
	m.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	m.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return m
}
