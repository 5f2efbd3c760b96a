package protocol

import (
	"errors"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// maxOwnerBytes bounds a tool definition's owner.
const maxOwnerBytes = 256

// CheckSemver adds a violation at field for every way s breaks Semantic
// Versioning 2.0.0 (MAJOR.MINOR.PATCH, then optional -PRERELEASE and
// +BUILD): each part is checked on its own, so a version with several
// problems lists them all.
func CheckSemver(vs *Violations, field, s string) {
	if strings.HasPrefix(s, "v") || strings.HasPrefix(s, "V") {
		vs.Add(field, VInvalidValue, "must not start with %q: semver is MAJOR.MINOR.PATCH, e.g. %q", s[:1], Clip(s[1:]))
		s = s[1:]
	}
	core, build, hasBuild := strings.Cut(s, "+")
	core, pre, hasPre := strings.Cut(core, "-")
	nums := strings.Split(core, ".")
	if len(nums) != 3 {
		vs.Add(field, VInvalidValue, "must have three numbers MAJOR.MINOR.PATCH, got %d in %q", len(nums), Clip(core))
	}
	for i, n := range nums[:min(len(nums), 3)] {
		part := [...]string{"major", "minor", "patch"}[i]
		switch {
		case n == "":
			vs.Add(field, VInvalidValue, "%s is empty", part)
		case strings.Trim(n, "0123456789") != "":
			vs.Add(field, VInvalidValue, "%s %q is not a number", part, Clip(n))
		case len(n) > 1 && n[0] == '0':
			vs.Add(field, VInvalidValue, "%s %q has a leading zero", part, Clip(n))
		}
	}
	if hasPre {
		checkSemverIdents(vs, field, "pre-release", pre, true)
	}
	if hasBuild {
		checkSemverIdents(vs, field, "build metadata", build, false)
	}
}

func checkSemverIdents(vs *Violations, field, what, s string, numericNoZero bool) {
	for i, id := range strings.Split(s, ".") {
		switch {
		case id == "":
			vs.Add(field, VInvalidValue, "%s identifier %d is empty", what, i+1)
		case strings.Trim(id, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-") != "":
			vs.Add(field, VInvalidValue, "%s identifier %q may hold only ASCII letters, digits and hyphens", what, Clip(id))
		case numericNoZero && len(id) > 1 && id[0] == '0' && strings.Trim(id, "0123456789") == "":
			vs.Add(field, VInvalidValue, "%s identifier %q is numeric with a leading zero", what, Clip(id))
		}
	}
}

var schemaPrinter = message.NewPrinter(language.English)

// schemaViolations adds a violation at field for every reason a schema did
// not compile: each keyword of a schema that is not valid against its
// metaschema on its own, else the compiler's error.
func schemaViolations(vs *Violations, field string, err error) {
	var sve *jsonschema.SchemaValidationError
	var ve *jsonschema.ValidationError
	if !errors.As(err, &sve) || !errors.As(sve.Err, &ve) {
		vs.Add(field, "invalid_schema", "is not a valid JSON Schema (2020-12): %v", err)
		return
	}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		f := field
		for _, p := range e.InstanceLocation {
			f += "." + p
		}
		vs.Add(f, "invalid_schema", "%s", e.ErrorKind.LocalizedString(schemaPrinter))
	}
	walk(ve)
}
