// Package kubernetes checks the deployment pieces in packaging/kubernetes against ceph-csi
// v3.12.2's manifests (the pinned copies in ceph-csi-v3.12.2/). tests/kustomize-check renders
// them with `go tool kustomize` and runs these tests with the renders' paths in
// RBD_OWNER_K8S_RENDERED and RBD_OWNER_K8S_EXAMPLE; without them the render tests skip.
package kubernetes

import (
	"bytes"
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

const (
	fixtureDir = "ceph-csi-v3.12.2"
	shimDir    = "/usr/lib/rbd-owner/bin"
	socketDir  = "/run/rbd-owner/csi"
	socketPath = socketDir + "/csi.sock"
	// The cephcsi image's PATH: the container runtime's default (the image sets none, nor does its
	// Ceph base image). The component's PATH must be the shim's directory and then exactly this.
	imagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// The git blob ids of the pinned files at ceph-csi's tag v3.12.2 (`git ls-tree v3.12.2
// deploy/rbd/kubernetes/ LICENSE`): the copies must stay unchanged, except csi-rbdplugin.yaml
// and csi-rbdplugin-provisioner.yaml, whose container images' registry hosts are replaced by
// images.invalid (upstream blobs ed2202b9441e4cdbba0057b2a56cedd9f7a5d945 and
// b7e59b429fb4aad3a6d1b4fec868e1a26b630e15; this project's files name no registry host). The
// provisioner's two files are the Kubernetes lab's (tests/k8s), not the render check's.
var upstreamBlobs = map[string]string{
	"csi-config-map.yaml":            "44ef712a49d5523b692b6cae25b06d59bd2a9f83",
	"csi-nodeplugin-rbac.yaml":       "baf5cdedc3da751cda45d8aad3cc1dfa5e3f79bd",
	"csidriver.yaml":                 "1d1ae5b1529f3ab332334be8f57930020865c665",
	"csi-rbdplugin.yaml":             "888063b45e4d2395acb4c186bc56c581013e485e",
	"csi-rbdplugin-provisioner.yaml": "17762a939e8f9e8db239aad40abc40a7e0f51868",
	"csi-provisioner-rbac.yaml":      "dc714bc454cec9bbe6a9914ecdd35239d2dcdbb9",
	"LICENSE":                        "f433b1a53f5b830a205fd2df78e2b34974656c7b",
}

// What the component adds to container csi-rbdplugin and to the pod.
var (
	wantEnv = []map[string]any{
		{"name": "PATH", "value": shimDir + ":" + imagePath},
		{"name": "RBD_OWNER_SOCKET", "value": socketPath},
	}
	wantMounts = []map[string]any{
		{"name": "rbd-owner-bin", "mountPath": shimDir, "readOnly": true},
		{"name": "rbd-owner-csi", "mountPath": socketDir},
	}
	wantVolumes = []map[string]any{
		{"name": "rbd-owner-bin", "hostPath": map[string]any{"path": shimDir, "type": "Directory"}},
		{"name": "rbd-owner-csi", "hostPath": map[string]any{"path": socketDir, "type": "Directory"}},
	}
	// the node plugin stays on a node tainted out-of-service (by an operator or the failover
	// controller), whatever the taint's effect (NoExecute, or NoSchedule as some guides add):
	// the node, when it comes back, unstages its deleted pods' volumes through it
	wantTolerations = []any{
		map[string]any{"key": "node.kubernetes.io/out-of-service", "operator": "Exists"},
	}
)

func TestFixturesUnchanged(t *testing.T) {
	entries, err := os.ReadDir(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() != "README.md" {
			names = append(names, e.Name())
		}
	}
	for name := range upstreamBlobs {
		if !slices.Contains(names, name) {
			t.Errorf("%s/%s is missing", fixtureDir, name)
		}
	}
	for _, name := range names {
		want, ok := upstreamBlobs[name]
		if !ok {
			t.Errorf("%s/%s: not one of the pinned upstream files (add its blob id here)", fixtureDir, name)
			continue
		}
		b, err := os.ReadFile(filepath.Join(fixtureDir, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha1.New()
		fmt.Fprintf(h, "blob %d\x00", len(b))
		h.Write(b)
		if got := fmt.Sprintf("%x", h.Sum(nil)); got != want {
			t.Errorf("%s/%s: git blob %s, upstream v3.12.2 has %s: the fixture must stay unchanged", fixtureDir, name, got, want)
		}
	}
}

// TestRendered: the render of tests/kubernetes holds exactly the fixture's objects, unchanged
// except for the component's additions to the DaemonSet csi-rbdplugin, which are all there.
func TestRendered(t *testing.T) {
	rendered := renderedFile(t, "RBD_OWNER_K8S_RENDERED")
	got := byKey(t, decodeAll(t, rendered))

	want := map[string]map[string]any{}
	for _, r := range kustomizationResources(t, "kustomization.yaml") {
		for k, v := range byKey(t, decodeAll(t, r)) {
			want[k] = v
		}
	}
	if len(got) != len(want) {
		t.Errorf("rendered %d objects, the fixtures have %d", len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: missing from the render", k)
			continue
		}
		if k == "DaemonSet/csi-rbdplugin" {
			g = checkAndStripAdditions(t, g)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s: differs from the fixture beyond the component's additions:\n%s", k, diffYAML(t, w, g))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: in the render but not in the fixtures", k)
		}
	}
}

// TestExample: the operator's example, rendered with its upstream URLs pointing at the pinned
// copies, gives the same output as tests/kubernetes.
func TestExample(t *testing.T) {
	example := renderedFile(t, "RBD_OWNER_K8S_EXAMPLE")
	rendered := renderedFile(t, "RBD_OWNER_K8S_RENDERED")
	a, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(rendered)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("packaging/kubernetes/example renders differently from tests/kubernetes (%s vs %s)", example, rendered)
	}
}

// TestRookSettings: rook/rook-ceph-operator-config.yaml declares the component's two volumes, and
// mounts for them: the socket directory where the component mounts it, the shim's directory
// first on the image's PATH (Rook cannot set the container's PATH).
func TestRookSettings(t *testing.T) {
	docs := decodeAll(t, "../../packaging/kubernetes/rook/rook-ceph-operator-config.yaml")
	if len(docs) != 1 || docs[0]["kind"] != "ConfigMap" || dig(docs[0], "metadata", "name") != "rook-ceph-operator-config" {
		t.Fatalf("want one ConfigMap rook-ceph-operator-config, got %v", docs)
	}
	data, _ := docs[0]["data"].(map[string]any)
	var volumes, mounts []map[string]any
	unmarshalString(t, data, "CSI_RBD_PLUGIN_VOLUME", &volumes)
	unmarshalString(t, data, "CSI_RBD_PLUGIN_VOLUME_MOUNT", &mounts)
	checkOperatorVolumes(t, "rook", volumes, mounts)
	var tolerations []any
	unmarshalString(t, data, "CSI_RBD_PLUGIN_TOLERATIONS", &tolerations)
	if !reflect.DeepEqual(tolerations, wantTolerations) {
		t.Errorf("rook: CSI_RBD_PLUGIN_TOLERATIONS %v, want the component's %v", tolerations, wantTolerations)
	}
}

// TestCephCSIOperatorDriver: the same for ceph-csi-operator/driver-rbd.yaml's Driver.
func TestCephCSIOperatorDriver(t *testing.T) {
	docs := decodeAll(t, "../../packaging/kubernetes/ceph-csi-operator/driver-rbd.yaml")
	if len(docs) != 1 || docs[0]["kind"] != "Driver" || docs[0]["apiVersion"] != "csi.ceph.io/v1" {
		t.Fatalf("want one csi.ceph.io/v1 Driver, got %v", docs)
	}
	list, _ := dig(docs[0], "spec", "nodePlugin", "volumes").([]any)
	var volumes, mounts []map[string]any
	for _, e := range list {
		m, _ := e.(map[string]any)
		if v, ok := m["volume"].(map[string]any); ok {
			volumes = append(volumes, v)
		}
		if v, ok := m["mount"].(map[string]any); ok {
			mounts = append(mounts, v)
		}
	}
	checkOperatorVolumes(t, "ceph-csi-operator", volumes, mounts)
	if got := dig(docs[0], "spec", "nodePlugin", "tolerations"); !reflect.DeepEqual(got, wantTolerations) {
		t.Errorf("ceph-csi-operator: nodePlugin.tolerations %v, want the component's %v", got, wantTolerations)
	}
}

// TestCephCSIDriversChartValues: ceph-csi-operator/values-ceph-csi-drivers.yaml gives the
// ceph-csi-drivers chart's RBD driver (drivers.rbd.nodePlugin) exactly driver-rbd.yaml's node
// plugin tolerations and volumes, and nothing else.
func TestCephCSIDriversChartValues(t *testing.T) {
	values := decodeAll(t, "../../packaging/kubernetes/ceph-csi-operator/values-ceph-csi-drivers.yaml")
	driver := decodeAll(t, "../../packaging/kubernetes/ceph-csi-operator/driver-rbd.yaml")
	if len(values) != 1 || len(driver) != 1 {
		t.Fatalf("want one document in each, got %d values and %d Driver", len(values), len(driver))
	}
	got := dig(values[0], "drivers", "rbd", "nodePlugin")
	want := dig(driver[0], "spec", "nodePlugin")
	if got == nil || !reflect.DeepEqual(got, want) {
		t.Errorf("drivers.rbd.nodePlugin is not driver-rbd.yaml's spec.nodePlugin:\n%s", diffYAML(t, want, got))
	}
	if d, _ := values[0]["drivers"].(map[string]any); len(d) != 1 || len(values[0]) != 1 {
		t.Errorf("the values set more than drivers.rbd: %v", values[0])
	}
}

func checkOperatorVolumes(t *testing.T, what string, volumes, mounts []map[string]any) {
	t.Helper()
	if !reflect.DeepEqual(volumes, wantVolumes) {
		t.Errorf("%s: volumes %v, want the component's %v", what, volumes, wantVolumes)
	}
	firstOnPath := strings.SplitN(imagePath, ":", 2)[0]
	want := []map[string]any{
		{"name": "rbd-owner-bin", "mountPath": firstOnPath, "readOnly": true},
		{"name": "rbd-owner-csi", "mountPath": socketDir},
	}
	if !reflect.DeepEqual(mounts, want) {
		t.Errorf("%s: mounts %v, want %v", what, mounts, want)
	}
}

// checkAndStripAdditions checks the component's additions in the rendered DaemonSet and returns
// a copy without them.
func checkAndStripAdditions(t *testing.T, ds map[string]any) map[string]any {
	t.Helper()
	ds = deepCopy(t, ds)
	pod, _ := dig(ds, "spec", "template", "spec").(map[string]any)
	containers, _ := pod["containers"].([]any)
	var c map[string]any
	for _, x := range containers {
		if m, _ := x.(map[string]any); m != nil && m["name"] == "csi-rbdplugin" {
			c = m
		}
	}
	if c == nil {
		t.Fatal("DaemonSet csi-rbdplugin: no container csi-rbdplugin")
	}

	env := strip(t, "env of csi-rbdplugin", c, "env", wantEnv)
	for _, e := range env {
		if m, _ := e.(map[string]any); m["name"] == "PATH" {
			t.Errorf("env of csi-rbdplugin: a second PATH: %v", m)
		}
	}
	strip(t, "volumeMounts of csi-rbdplugin", c, "volumeMounts", wantMounts)
	strip(t, "volumes", pod, "volumes", wantVolumes)
	// the fixture has no tolerations: the patch's list is the whole of it
	if got := pod["tolerations"]; !reflect.DeepEqual(got, wantTolerations) {
		t.Errorf("tolerations: %v, want %v", got, wantTolerations)
	}
	delete(pod, "tolerations")

	return ds
}

// strip removes each of want from the list parent[key] (each exactly once, and equal), reports
// what is missing or different, and drops the key when nothing else is left (the fixture may
// have had no such list).
func strip(t *testing.T, what string, parent map[string]any, key string, want []map[string]any) []any {
	t.Helper()
	list, _ := parent[key].([]any)
	for _, w := range want {
		n := 0
		var kept []any
		for _, x := range list {
			m, _ := x.(map[string]any)
			if m != nil && m["name"] == w["name"] {
				n++
				if !reflect.DeepEqual(m, w) {
					t.Errorf("%s: %v, want %v", what, m, w)
				}
				continue
			}
			kept = append(kept, x)
		}
		if n != 1 {
			t.Errorf("%s: %d entries named %v, want 1", what, n, w["name"])
		}
		list = kept
	}
	if len(list) == 0 {
		delete(parent, key)
	} else {
		parent[key] = list
	}
	return list
}

func renderedFile(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		t.Skipf("%s not set: run tests/kustomize-check (make k8s-check), which renders with kustomize", env)
	}
	return p
}

func kustomizationResources(t *testing.T, path string) []string {
	t.Helper()
	docs := decodeAll(t, path)
	if len(docs) != 1 {
		t.Fatalf("%s: %d documents", path, len(docs))
	}
	var out []string
	list, _ := docs[0]["resources"].([]any)
	for _, r := range list {
		s, _ := r.(string)
		if !strings.HasPrefix(s, fixtureDir+"/") {
			t.Fatalf("%s: resource %q is not one of the pinned fixtures", path, s)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no resources", path)
	}
	return out
}

func decodeAll(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

func byKey(t *testing.T, docs []map[string]any) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, d := range docs {
		k := fmt.Sprintf("%v/%v", d["kind"], dig(d, "metadata", "name"))
		if _, dup := out[k]; dup {
			t.Fatalf("two objects %s", k)
		}
		out[k] = d
	}
	return out
}

func dig(m map[string]any, keys ...string) any {
	var cur any = m
	for _, k := range keys {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[k]
	}
	return cur
}

func unmarshalString(t *testing.T, data map[string]any, key string, out any) {
	t.Helper()
	s, ok := data[key].(string)
	if !ok {
		t.Fatalf("data.%s missing", key)
	}
	if err := yaml.Unmarshal([]byte(s), out); err != nil {
		t.Fatalf("data.%s: %v", key, err)
	}
}

func deepCopy(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := yaml.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// diffYAML shows the first differing lines of the two objects as YAML (keys sorted).
func diffYAML(t *testing.T, want, got any) string {
	t.Helper()
	w, _ := yaml.Marshal(want)
	g, _ := yaml.Marshal(got)
	wl, gl := strings.Split(string(w), "\n"), strings.Split(string(g), "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var a, b string
		if i < len(wl) {
			a = wl[i]
		}
		if i < len(gl) {
			b = gl[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n  fixture:  %s\n  rendered: %s", i+1, a, b)
		}
	}
	return "(no line differs: a type differs)"
}
