package auth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/cgledger/cgledger/protocol"
)

// Every project has an account of its own, so that nothing a client does,
// not even choosing the reply subject of a request (NATS delivers answers
// wherever the requester says, unchecked), can reach another project's
// subscribers. A project's account imports only that project's API
// subjects, commands, wakeups and cancel entries from the ledger's account
// (and the tool consumer pull and ack subjects, which user permissions
// narrow to one consumer).
//
// A project account's key is derived from the clients' signing seed and the
// project id, so nothing has to be stored per project and rotating that
// seed replaces every project account (their credentials stop working;
// project accounts hold no data). Its JWT is signed by the operator and
// written under the key directory (accounts/) when a credential is issued;
// the embedded server reads it from there when the first such credential connects.

// accountsDir is where project account JWTs are kept, under the key dir.
const accountsDir = "accounts"

// ProjectAccount derives the account key of a project.
func (k *Keys) ProjectAccount(project string) (nkeys.KeyPair, error) {
	raw, err := derive(k.ClientsSigning, "project-account\x00"+project)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteAccount, raw)
	if err != nil {
		return nil, fmt.Errorf("auth: project account key: %w", err)
	}
	return kp, nil
}

// projectAccountJWT is the operator-signed account JWT of a project.
func (k *Keys) projectAccountJWT(project string, acc nkeys.KeyPair) (string, error) {
	if k.Operator == nil {
		return "", errors.New("auth: project accounts need the operator key")
	}
	pub, err := acc.PublicKey()
	if err != nil {
		return "", fmt.Errorf("auth: project account key: %w", err)
	}
	ledgerPub, err := k.Account.PublicKey()
	if err != nil {
		return "", fmt.Errorf("auth: ledger account key: %w", err)
	}
	ac := jwt.NewAccountClaims(pub)
	ac.Name = "project:" + project
	for _, im := range clientImports(ledgerPub, project) {
		ac.Imports.Add(im)
	}
	tok, err := ac.Encode(k.Operator)
	if err != nil {
		return "", fmt.Errorf("auth: sign project account: %w", err)
	}
	return tok, nil
}

// clientImports are the imports of a clients' account from the ledger's:
// every project's subjects for the all-projects account (project ""), one
// project's otherwise.
func clientImports(ledgerPub, project string) []*jwt.Import {
	var out []*jwt.Import
	for _, e := range ledgerExports() {
		subj := string(e.Subject)
		if project != "" {
			switch {
			case subj == APIPrefix+".>":
				subj = APIPrefix + "." + project + ".>"
			case subj == protocol.CommandSubjectPattern("*", "*"):
				subj = protocol.CommandSubjectPattern("*", project)
			case subj == protocol.CancelSubjectPattern("*", "*"):
				subj = protocol.CancelSubjectPattern("*", project)
			}
		}
		im := &jwt.Import{Name: e.Name, Subject: jwt.Subject(subj), Account: ledgerPub, Type: e.Type}
		// A clients' account has no JetStream of its own, and the server
		// answers its $JS.API.> itself ("not enabled"): the JetStream API of
		// tool consumers is imported under ToolJSAPIPrefix instead.
		if rest, ok := strings.CutPrefix(subj, "$JS.API."); ok {
			im.LocalSubject = jwt.RenamingSubject(ToolJSAPIPrefix + "." + rest)
		}
		out = append(out, im)
	}
	return out
}

// AccountResolver serves the embedded server the account JWTs it was
// started with, and project account JWTs from the accounts directory as
// they are issued.
type AccountResolver struct {
	server.MemAccResolver
	dir  string
	keys *Keys
}

// NewAccountResolver resolves static JWTs (by account public key) and then
// the project account files under keys' directory that belong to keys: a
// file whose project account key does not derive from the current keys
// (left behind by a rotation, or put there by hand) is ignored, so rotating
// the clients' signing key revokes every project credential whatever the
// directory holds. Nil keys resolve the static JWTs only.
func NewAccountResolver(static map[string]string, keys *Keys) (*AccountResolver, error) {
	r := &AccountResolver{keys: keys}
	if keys != nil && keys.Dir != "" {
		r.dir = filepath.Join(keys.Dir, accountsDir)
	}
	for acc, tok := range static {
		if err := r.MemAccResolver.Store(acc, tok); err != nil {
			return nil, fmt.Errorf("auth: store account: %w", err)
		}
	}
	return r, nil
}

// Fetch returns an account's JWT. Only well-formed account public keys are
// looked up on disk.
func (r *AccountResolver) Fetch(name string) (string, error) {
	if tok, err := r.MemAccResolver.Fetch(name); err == nil {
		return tok, nil
	}
	if r.dir == "" || !nkeys.IsValidPublicAccountKey(name) {
		return "", server.ErrMissingAccount
	}
	b, err := os.ReadFile(filepath.Join(r.dir, name+".jwt"))
	if err != nil {
		return "", server.ErrMissingAccount
	}
	tok := strings.TrimSpace(string(b))
	ac, err := jwt.DecodeAccountClaims(tok)
	if err != nil || ac.Subject != name {
		return "", server.ErrMissingAccount
	}
	project, ok := strings.CutPrefix(ac.Name, "project:")
	if !ok {
		return "", server.ErrMissingAccount
	}
	want, err := r.keys.ProjectAccount(project)
	if err != nil {
		return "", server.ErrMissingAccount
	}
	if pub, err := want.PublicKey(); err != nil || pub != name {
		return "", server.ErrMissingAccount
	}
	return tok, nil
}
