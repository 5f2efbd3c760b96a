package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit codes (documented in docs/cli.md).
const (
	exitOK          = 0
	exitFailed      = 1 // the operation ran and said no: call not success, verification failed, refused request
	exitUsage       = 2 // bad flags, arguments or configuration
	exitUnreachable = 3 // the server (NATS or HTTP) could not be reached
)

// parseArgs parses flags wherever they appear among the positional
// arguments, as users of Go CLIs expect ("audit turn T1 --project p" and
// "audit turn --project p T1" both work).
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// newFlagSet makes a flag set whose usage shows the verb's synopsis.
func newFlagSet(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: cgledger %s\n\n%s\n\nFlags:\n", synopsis, strings.TrimSpace(description))
		printFlags(out, fs)
	}
	return fs
}

// printFlags lists fs's flags as the docs spell them (--name, not Go's
// -name), each with its default when it has one.
func printFlags(out io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + strings.ToUpper(name)
		}
		fmt.Fprintln(out, line)
		if d := f.DefValue; d != "" && d != "false" && d != "0" && d != "[]" && !strings.Contains(usage, "default ") {
			usage += fmt.Sprintf(" (default %s)", d)
		}
		fmt.Fprintf(out, "        %s\n", strings.ReplaceAll(usage, "\n", "\n        "))
	})
}

// parseOrExit parses args; ok=false means the caller returns code.
func parseOrExit(fs *flag.FlagSet, args []string, npos ...int) (pos []string, code int, ok bool) {
	// The flag package writes its own error and the whole help to the flag
	// set's output; asked for, help goes to standard output instead, and an
	// error is one line in the docs' spelling (--name) with where to look.
	var discard strings.Builder
	usage := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(&discard)
	pos, err := parseArgs(fs, args)
	fs.SetOutput(os.Stderr)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(os.Stderr)
		return nil, exitOK, false
	}
	if err != nil {
		// The flag package names a flag "-name" after ": ", "flag " or "for ".
		msg := strings.NewReplacer(": -", ": --", "flag -", "flag --", "for -", "for --").Replace(err.Error())
		fmt.Fprintf(os.Stderr, "cgledger %s: %s\nRun cgledger %s --help for its flags.\n", fs.Name(), msg, fs.Name())
		return nil, exitUsage, false
	}
	if len(npos) > 0 && len(pos) != npos[0] {
		fmt.Fprintf(os.Stderr, "cgledger %s: want %d argument(s), got %d\nRun cgledger %s --help for its usage.\n", fs.Name(), npos[0], len(pos), fs.Name())
		return nil, exitUsage, false
	}
	return pos, exitOK, true
}

// failf prints an error to stderr and returns code.
func failf(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "cgledger: "+format+"\n", args...)
	return code
}

var stdout io.Writer = os.Stdout

// groupHelp answers a command group (approvals, calls, tools) called
// without a subcommand, usage on stderr and exitUsage, or asked for help,
// usage on stdout and exitOK; done=false means args name a subcommand.
func groupHelp(args []string, usage string) (code int, done bool) {
	if len(args) > 0 && args[0] != "--help" && args[0] != "-h" && args[0] != "help" {
		return 0, false
	}
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitUsage, true
	}
	fmt.Fprint(stdout, usage)
	return exitOK, true
}
