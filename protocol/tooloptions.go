package protocol

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
)

// OptionsCheck validates one member of a tool definition's options, raw (not
// null), found at field path field ("tool.options.<key>"), adding every
// violation to vs.
type OptionsCheck func(field string, raw json.RawMessage, vs *Violations)

var (
	optionsMu     sync.RWMutex
	optionsChecks = map[string]OptionsCheck{}
)

// RegisterOptions makes ParseToolJSON and ParseToolYAML check the member key
// of a definition's options with check. The options of a vendor's tool
// belong to the vendor's package (executor/jina holds options.jina), which
// registers them in an init function, as image formats register with
// package image: the protocol names no vendor. A member no package
// registered is kept as given, unchecked. RegisterOptions panics when key is
// one the protocol checks itself (args, envs) or is registered twice.
func RegisterOptions(key string, check OptionsCheck) {
	optionsMu.Lock()
	defer optionsMu.Unlock()
	if key == "args" || key == "envs" {
		panic(fmt.Sprintf("protocol: options.%s is checked by the protocol itself", key))
	}
	if _, dup := optionsChecks[key]; dup {
		panic(fmt.Sprintf("protocol: options.%s registered twice", key))
	}
	optionsChecks[key] = check
}

// checkVendorOptions runs the registered checks on the members of raw (a
// JSON object), in key order so that violations come in a stable order.
func checkVendorOptions(vs *Violations, field string, raw json.RawMessage) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil {
		return // checkOptions has recorded it
	}
	optionsMu.RLock()
	defer optionsMu.RUnlock()
	keys := make([]string, 0, len(members))
	for k := range members {
		if optionsChecks[k] != nil && !isNull(members[k]) && len(members[k]) > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		optionsChecks[k](field+"."+k, members[k], vs)
	}
}
