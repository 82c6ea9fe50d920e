package config

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// yamlPaths is every key of t as Keys names it, the keys of a list of mappings under
// "name[].", each with the field's type.
func yamlPaths(t reflect.Type, prefix string) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for _, f := range yamlFields(t) {
		ft := t.Field(f.index).Type
		out[prefix+f.name] = ft
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			for name, sub := range yamlPaths(ft.Elem(), prefix+f.name+"[].") {
				out[name] = sub
			}
		}
	}
	return out
}

// TestKeysNameEveryField: Keys has one entry for each yaml-tagged field of Config, the
// clusters' fields too, and none for a field that does not exist; each entry's type is its
// field's, and it says what the key means.
func TestKeysNameEveryField(t *testing.T) {
	fields := yamlPaths(reflect.TypeFor[Config](), "")
	if _, ok := fields["clusters[].id"]; !ok || ClustersPrefix != "clusters[]." {
		t.Fatalf("the walk found no clusters[].id: %v", fields)
	}
	seen := map[string]bool{}
	for _, k := range Keys() {
		if seen[k.Name] {
			t.Errorf("Keys has %s twice", k.Name)
		}
		seen[k.Name] = true
		ft, ok := fields[k.Name]
		if !ok {
			t.Errorf("Keys has %s, which no yaml tag of Config or Cluster names", k.Name)
			continue
		}
		if want := typeName(ft); !slices.Contains(want, k.Type) {
			t.Errorf("%s: type %q, want one of %q (the field is %s)", k.Name, k.Type, want, ft)
		}
		if k.Doc == "" || (k.Summary == "" && !strings.HasPrefix(k.Name, ClustersPrefix)) {
			t.Errorf("%s: no Doc or no Summary", k.Name)
		}
		if k.Default == "" && k.DefaultNote == "" {
			t.Errorf("%s: neither a default nor a note on it", k.Name)
		}
		for _, text := range []string{k.Doc, k.Summary, k.Rule, k.DefaultNote} {
			if strings.Count(text, "`")%2 != 0 || strings.ContainsAny(text, "\n|") {
				t.Errorf("%s: unbalanced backquotes, a newline or a '|' in %q", k.Name, text)
			}
		}
	}
	for name := range fields {
		if !seen[name] {
			t.Errorf("the config key %s has no entry in Keys (agent/config/keys.go)", name)
		}
	}
}

func typeName(t reflect.Type) []string {
	switch {
	case t == durationType:
		return []string{"duration"}
	case t.Kind() == reflect.Bool || t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Bool:
		return []string{"boolean"}
	case t.Kind() == reflect.String:
		return []string{"string", "path", "host:port"}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return []string{"list of strings"}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return []string{"list of mappings"}
	}
	return nil
}

// TestKeyDefaults: each key's Default is what Parse fills in when the key is left out, and
// writing it out gives the same config.
func TestKeyDefaults(t *testing.T) {
	const cluster = "  - {id: ceph-a, monitors: [203.0.113.1:6789], user: rbd-owner, keyring: /etc/ceph/k}\n"
	mid := machineID(t)
	empty, err := Parse([]byte("clusters:\n"+cluster), mid)
	if err != nil {
		t.Fatal(err)
	}
	if empty.NodeID != "0123456789abcdef0123456789abcdef" {
		t.Errorf("node_id %q, not the machine id", empty.NodeID)
	}
	top, sub := "clusters:\n"+cluster, "clusters:\n"+cluster
	for _, k := range Keys() {
		if k.Default == "" {
			continue
		}
		name, isSub := strings.CutPrefix(k.Name, ClustersPrefix)
		got := shown(empty, name)
		if isSub {
			got = shown(&empty.Clusters[0], name)
			sub = strings.TrimSuffix(sub, "}\n") + ", " + name + ": " + k.Default + "}\n"
		} else {
			top += name + ": " + k.Default + "\n"
		}
		if got != k.Default {
			t.Errorf("%s: Keys says the default is %s, Parse fills in %s", k.Name, k.Default, got)
		}
	}
	for _, doc := range []string{top, sub} {
		c, err := Parse([]byte(doc), mid)
		if err != nil {
			t.Fatalf("the defaults written out:\n%s\n%v", doc, err)
		}
		if c.OrphanSweep != nil && *c.OrphanSweep {
			c.OrphanSweep = nil // left out, it is nil: on
		}
		for _, x := range []*Config{c, empty} { // [] and left out are the same
			for i := range x.Clusters {
				if len(x.Clusters[i].MapOptions) == 0 {
					x.Clusters[i].MapOptions = nil
				}
			}
			if len(x.MapOptions) == 0 {
				x.MapOptions = nil
			}
		}
		if !reflect.DeepEqual(c, empty) {
			t.Errorf("the defaults written out:\n%s\ngive %+v\nleft out: %+v", doc, c, empty)
		}
	}
}

// shown is the value of the field tagged name in the struct s points to, as the file would
// have it.
func shown(s any, name string) string {
	v := reflect.ValueOf(s).Elem()
	for _, f := range yamlFields(v.Type()) {
		if f.name != name {
			continue
		}
		switch fv := v.Field(f.index); fv.Interface().(type) {
		case Duration:
			return FormatDuration(time.Duration(fv.Int()))
		case *bool:
			return strconv.FormatBool(fv.IsNil() || fv.Elem().Bool()) // nil: on (SweepsOrphans)
		case bool:
			return strconv.FormatBool(fv.Bool())
		case string:
			if fv.String() == "" {
				return `""`
			}
			return fv.String()
		case []string:
			return "[" + strings.Join(fv.Interface().([]string), ", ") + "]"
		}
		return "(not shown: " + v.Field(f.index).Type().String() + ")"
	}
	return "(no field " + name + ")"
}

// TestKeyValuesAndRules: each word a key takes is accepted, and the bounds Keys states hold.
func TestKeyValuesAndRules(t *testing.T) {
	mid := machineID(t)
	for _, k := range Keys() {
		for _, v := range k.Values {
			if _, err := Parse([]byte("clusters: []\n"+k.Name+": "+v.Name+"\n"), mid); err != nil || v.Doc == "" {
				t.Errorf("%s: %s: %v (or no meaning)", k.Name, v.Name, err)
			}
		}
	}
	for doc, ok := range map[string]bool{
		"map_timeout: 999ms": false, "map_timeout: 1s": true,
		"mount_timeout: 999ms": false, "mount_timeout: 1s": true, "mount_timeout: 5m": true, "mount_timeout: 301s": false,
		"orphan_sweep_interval: 59s": false, "orphan_sweep_interval: 1m": true,
		"fence_expiry: 59m": false, "fence_expiry: 1h": true,
		"node_id: " + strings.Repeat("n", 128): true, "node_id: " + strings.Repeat("n", 129): false,
		"lease_duration: 70s\nrenew_interval: 20s": false, "lease_duration: 71s\nrenew_interval: 20s": true,
		"lease_duration: 50s\nrenew_interval: 20s\nosd_failover: 10s": false, "lease_duration: 51s\nrenew_interval: 20s\nosd_failover: 10s": true,
		"osd_failover: 999ms": false, "osd_failover: 1s": true, "lease_duration: 1h\nosd_failover: 10m": true, "lease_duration: 1h\nosd_failover: 601s": false,
	} {
		_, err := Parse([]byte("clusters: []\n"+doc+"\n"), mid)
		if (err == nil) != ok {
			t.Errorf("%q: accepted %v, want %v (%v)", doc, err == nil, ok, err)
		}
	}
	for _, d := range []struct {
		d    time.Duration
		want string
	}{{0, "0s"}, {30 * time.Second, "30s"}, {time.Minute, "60s"}, {5 * time.Minute, "5m"}, {90 * time.Minute, "90m"},
		{87600 * time.Hour, "87600h"}, {1500 * time.Millisecond, "1.5s"}} {
		if got := FormatDuration(d.d); got != d.want {
			t.Errorf("FormatDuration(%s) = %s, want %s", d.d, got, d.want)
		}
	}
}
