package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// This file turns a config document into a Config, key by key, so that every mistake is told in
// the file's own terms: the line, the key's path (clusters[0].keyring) and what to write
// instead. yaml.v3 parses the document into a node tree (which knows the lines); the walk below
// checks each key against the yaml tags of Config and Cluster and decodes each value itself.

// keyError is one mistake in the config: the key's path, what is wrong and what to do, and the
// line of the file it is on (0 when the key is not in the file: a default, a missing key).
type keyError struct {
	line int
	path string
	msg  string
}

func (e *keyError) Error() string {
	s := e.msg
	if e.path != "" {
		s = e.path + ": " + s
	}
	if e.line > 0 {
		s = fmt.Sprintf("line %d: %s", e.line, s)
	}
	return s
}

// fieldErr is a mistake in a key's value found after decoding; Parse adds the key's line.
func fieldErr(path, format string, args ...any) error {
	return &keyError{path: path, msg: fmt.Sprintf(format, args...)}
}

// document is a parsed config file: its top mapping, nil for an empty file.
type document struct{ top *yaml.Node }

// parseDocument parses data as YAML and decodes it into c.
func parseDocument(data []byte, c *Config) (*document, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, syntaxError(err)
	}
	doc := &document{}
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		doc.top = resolve(root.Content[0])
	}
	if doc.top == nil || isNull(doc.top) {
		doc.top = nil
		return doc, nil
	}
	if doc.top.Kind != yaml.MappingNode {
		return nil, &keyError{line: doc.top.Line, msg: fmt.Sprintf("%s is not a config; write one \"key: value\" per line, e.g. lease_duration: 60s", describe(doc.top))}
	}
	return doc, decodeStruct(doc.top, "", reflect.ValueOf(c).Elem())
}

var yamlLineRe = regexp.MustCompile(`^line (\d+): `)

// syntaxError says where the YAML parser gave up. yaml.v3 gives the line of the construct it
// was in (a flow list's start) or, for some mistakes, the line before the offending one: hence
// "at or just after".
func syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &keyError{}
	if m := yamlLineRe.FindStringSubmatch(msg); m != nil {
		e.line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	}
	where := ""
	if e.line > 0 {
		where = " at or just after this line"
	}
	e.msg = "not valid YAML" + where + " (" + msg + "); check the indentation, and quote a value that holds \": \" or starts with a special character"
	return e
}

// has says whether the document sets the top-level key.
func (d *document) has(key string) bool {
	if d.top == nil {
		return false
	}
	for i := 0; i+1 < len(d.top.Content); i += 2 {
		if d.top.Content[i].Value == key {
			return true
		}
	}
	return false
}

var segmentRe = regexp.MustCompile(`^([A-Za-z0-9_]+)((?:\[\d+\])*)$`)
var indexRe = regexp.MustCompile(`\[(\d+)\]`)

// line is the line of the deepest part of path (clusters[0].monitors[1]) that the document has:
// an error about a key a cluster entry lacks points at the entry. 0 when even the top-level key
// is absent (the value is a default).
func (d *document) line(path string) int {
	if d == nil || d.top == nil || path == "" {
		return 0
	}
	n, line := d.top, 0
	for _, seg := range strings.Split(path, ".") {
		m := segmentRe.FindStringSubmatch(seg)
		if m == nil || n.Kind != yaml.MappingNode {
			return line
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == m[1] {
				line, next = n.Content[i].Line, resolve(n.Content[i+1])
				break
			}
		}
		if next == nil {
			return line
		}
		n = next
		for _, ix := range indexRe.FindAllStringSubmatch(m[2], -1) {
			i, _ := strconv.Atoi(ix[1])
			if n.Kind != yaml.SequenceNode || i >= len(n.Content) {
				return line
			}
			n = resolve(n.Content[i])
			line = n.Line
		}
	}
	return line
}

// withLine gives a keyError from the checks after decoding the line of its key.
func (d *document) withLine(err error) error {
	if e, ok := err.(*keyError); ok && e.line == 0 {
		e.line = d.line(e.path)
	}
	return err
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isMerge(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!merge" }

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// describe names a node as the reader wrote it: its value quoted, or "a list", "a mapping".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	return strconv.Quote(n.Value)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// field is one key of a struct: its yaml name and its index.
type field struct {
	name  string
	index int
}

func yamlFields(t reflect.Type) []field {
	var fs []field
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			fs = append(fs, field{name, i})
		}
	}
	return fs
}

// decodeStruct decodes mapping n into the struct out, refusing keys it does not have.
func decodeStruct(n *yaml.Node, path string, out reflect.Value) error {
	fields := yamlFields(out.Type())
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	// YAML merge keys (<<: *common) first: the mapping's own keys override what they bring
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := resolve(n.Content[i]); isMerge(k) {
			v := resolve(n.Content[i+1])
			from := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				from = v.Content
			}
			for _, m := range from {
				if m = resolve(m); m.Kind != yaml.MappingNode {
					return &keyError{line: k.Line, path: join(path, "<<"), msg: describe(m) + " cannot be merged; merge a mapping, e.g. <<: *common"}
				}
				if err := decodeStruct(m, path, out); err != nil {
					return err
				}
			}
		}
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if isMerge(k) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			return &keyError{line: k.Line, path: path, msg: fmt.Sprintf("%s is not a key; write one \"key: value\" per line", describe(k))}
		}
		idx := -1
		for _, f := range fields {
			if f.name == k.Value {
				idx = f.index
			}
		}
		if idx < 0 {
			msg := "unknown key; "
			if s := closest(k.Value, names); s != "" {
				msg += "did you mean " + s + "?"
			} else {
				msg += "the keys here are " + strings.Join(names, ", ")
			}
			return &keyError{line: k.Line, path: join(path, k.Value), msg: msg}
		}
		if first, dup := seen[k.Value]; dup {
			return &keyError{line: k.Line, path: join(path, k.Value), msg: fmt.Sprintf("set twice (first on line %d); keep one", first)}
		}
		seen[k.Value] = k.Line
		if err := decodeValue(v, join(path, k.Value), out.Field(idx)); err != nil {
			return err
		}
	}
	return nil
}

var durationType = reflect.TypeFor[Duration]()

// decodeValue decodes one value into out; null leaves out at its zero value (the default).
func decodeValue(n *yaml.Node, path string, out reflect.Value) error {
	if isNull(n) {
		return nil
	}
	bad := func(msg string) error { return &keyError{line: n.Line, path: path, msg: msg} }
	switch t := out.Type(); {
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			return bad(describe(n) + " is not a duration; " + durationForm)
		}
		d, err := parseDuration(n.Value)
		if err != nil {
			return bad(err.Error())
		}
		out.SetInt(int64(d))
	case t.Kind() == reflect.String:
		if n.Kind != yaml.ScalarNode {
			return bad(describe(n) + " is not accepted here; write a single value")
		}
		out.SetString(n.Value)
	case t.Kind() == reflect.Bool || t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
			return bad(describe(n) + " is not accepted; write true or false")
		}
		if t.Kind() == reflect.Pointer {
			out.Set(reflect.ValueOf(&b))
		} else {
			out.SetBool(b)
		}
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		switch n.Kind {
		case yaml.ScalarNode:
			if strings.HasSuffix(path, "map_options") {
				// never echoed: a misplaced secret must not reach a log
				return bad("a single value is not a list; put the option in brackets, e.g. [queue_depth=128]")
			}
			return bad(fmt.Sprintf("%s is not a list; write [%s]", describe(n), n.Value))
		case yaml.MappingNode:
			return bad("a mapping is not a list; write [a, b], or one \"- a\" per line")
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			e = resolve(e)
			if e.Kind != yaml.ScalarNode || isNull(e) {
				return &keyError{line: e.Line, path: fmt.Sprintf("%s[%d]", path, i),
					msg: describe(e) + " is not accepted; write each entry as one value (quote it if it holds \": \")"}
			}
			s.Index(i).SetString(e.Value)
		}
		out.Set(s)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		if n.Kind != yaml.SequenceNode {
			return bad(describe(n) + " is not a list; start each entry with \"- \", e.g. \"- id: ceph-a\"")
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			e = resolve(e)
			p := fmt.Sprintf("%s[%d]", path, i)
			if e.Kind != yaml.MappingNode {
				return &keyError{line: e.Line, path: p, msg: fmt.Sprintf("%s is not accepted; write the entry's keys (%s) under its \"- \"",
					describe(e), strings.Join(fieldNames(t.Elem()), ", "))}
			}
			if err := decodeStruct(e, p, s.Index(i)); err != nil {
				return err
			}
		}
		out.Set(s)
	default:
		return bad(fmt.Sprintf("cannot be decoded into %s (a bug in rbd-owner: report it)", t))
	}
	return nil
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for _, f := range yamlFields(t) {
		names = append(names, f.name)
	}
	return names
}

const durationForm = "write a number and a unit (ms, s, m or h), e.g. 30s, 1m or 1h30m"

var durationWordsRe = regexp.MustCompile(`^(\d+(?:\.\d+)?)\s*([a-zA-Z]*)$`)

// the units people write, by the Go unit they mean
var durationUnits = map[string]string{
	"ms": "ms", "msec": "ms", "msecs": "ms", "millisecond": "ms", "milliseconds": "ms",
	"s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
	"m": "m", "min": "m", "mins": "m", "minute": "m", "minutes": "m",
	"h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
	"d": "d", "day": "d", "days": "d",
}

// parseDuration parses a Go duration; its error says how to write s as one.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	q := strconv.Quote(s)
	m := durationWordsRe.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%s is not a duration; %s", q, durationForm)
	}
	num, unit := m[1], durationUnits[strings.ToLower(m[2])]
	switch {
	case m[2] == "":
		return 0, fmt.Errorf("%s is not a duration (it has no unit); write %ss or %sm, as you mean it", q, num, num)
	case unit == "d":
		if days, err := strconv.ParseFloat(num, 64); err == nil {
			return 0, fmt.Errorf("%s is not a duration; write %sh (the largest unit is h)", q, strconv.FormatFloat(days*24, 'f', -1, 64))
		}
	case unit != "":
		return 0, fmt.Errorf("%s is not a duration; write %s%s (a number and a unit: ms, s, m or h)", q, num, unit)
	}
	return 0, fmt.Errorf("%s is not a duration; %s", q, durationForm)
}

// closest is the name among names nearest to word by edit distance, when it is close enough to
// be the word meant: at most 1 edit for a word of up to 4 letters, 2 up to 10, 3 beyond.
// Case and the choice of '-' or '_' do not count. "" when none is close.
func closest(word string, names []string) string {
	norm := func(s string) string { return strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(s)) }
	w := norm(word)
	limit := 3
	switch {
	case len(w) <= 4:
		limit = 1
	case len(w) <= 10:
		limit = 2
	}
	best, bestD := "", limit+1
	for _, n := range names {
		if d := editDistance(w, norm(n)); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance: insertions, deletions, substitutions
// and transpositions of neighbours each count 1.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// oneOf refuses value unless it is one of values, suggesting the closest.
func oneOf(path, value string, values ...string) error {
	for _, v := range values {
		if value == v {
			return nil
		}
	}
	list := strings.Join(values[:len(values)-1], ", ") + " and " + values[len(values)-1]
	if s := closest(value, values); s != "" {
		return fieldErr(path, "%q is not accepted; did you mean %s? (the values are %s)", value, s, list)
	}
	return fieldErr(path, "%q is not accepted; the values are %s", value, list)
}
