// Package yamlread reads a YAML (or JSON) document into a Go value the
// lenient way: an unknown key, a key given twice or a value of the wrong
// type becomes a violation at its path and the reading goes on, so that one
// answer lists every problem of a configuration file (mcpbridge's config,
// the conformance fixture) beside the checks of its meaning.
package yamlread

import (
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/cgledger/cgledger/protocol"
)

// Options says how a document's keys name a value's fields.
type Options struct {
	// Tag is the struct tag whose name (before any comma) is a field's key:
	// "json" or "yaml".
	Tag string
	// Root is the path of the document itself in violations, used when the
	// path given to Decode is empty.
	Root string
	// Noun is what an unknown key is called in its violation ("field",
	// "member").
	Noun string
}

// Decode sets the value target points to from n, adding every problem to
// vs under path (keys below it joined with "."). A null leaves a value as
// it is.
func Decode(n *yaml.Node, target any, path string, o Options, vs *protocol.Violations) {
	decode(n, reflect.ValueOf(target).Elem(), path, o, vs)
}

func decode(n *yaml.Node, v reflect.Value, path string, o Options, vs *protocol.Violations) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	field := path
	if field == "" {
		field = o.Root
	}
	switch v.Kind() {
	case reflect.Interface:
		if err := n.Decode(v.Addr().Interface()); err != nil {
			vs.Add(field, protocol.VInvalidValue, "cannot be read: %v", err)
		}
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		decode(n, p.Elem(), path, o, vs)
		v.Set(p)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			vs.Add(field, protocol.VInvalidType, "must be a mapping")
			return
		}
		fields := map[string]int{}
		var names []string
		for i := 0; i < v.NumField(); i++ {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get(o.Tag), ",")
			if name != "" && name != "-" {
				fields[name] = i
				names = append(names, name)
			}
		}
		eachPair(n, path, vs, func(key string, val *yaml.Node, at string) {
			i, ok := fields[key]
			if !ok {
				vs.Add(at, protocol.VInvalidValue, "unknown %s (%ss here: %s)", o.Noun, o.Noun, strings.Join(names, ", "))
				return
			}
			decode(val, v.Field(i), at, o, vs)
		})
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			vs.Add(field, protocol.VInvalidType, "must be a mapping")
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		eachPair(n, path, vs, func(key string, val *yaml.Node, at string) {
			e := reflect.New(v.Type().Elem()).Elem()
			decode(val, e, at, o, vs)
			v.SetMapIndex(reflect.ValueOf(key).Convert(v.Type().Key()), e)
		})
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			vs.Add(field, protocol.VInvalidType, "must be a sequence")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			decode(item, s.Index(i), fmt.Sprintf("%s[%d]", field, i), o, vs)
		}
		v.Set(s)
	default:
		if n.Kind != yaml.ScalarNode {
			vs.Add(field, protocol.VInvalidType, "must be a %s", v.Kind())
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			vs.Add(field, protocol.VInvalidType, "must be a %s, got %q", v.Kind(), n.Value)
		}
	}
}

// eachPair calls f with each key of mapping n, its value and its path; a
// key met twice is a violation (the first is kept).
func eachPair(n *yaml.Node, path string, vs *protocol.Violations, f func(key string, val *yaml.Node, at string)) {
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := n.Content[i].Value
		at := key
		if path != "" {
			at = path + "." + key
		}
		if seen[key] {
			vs.Add(at, protocol.VDuplicate, "is given twice (line %d)", n.Content[i].Line)
			continue
		}
		seen[key] = true
		f(key, n.Content[i+1], at)
	}
}
