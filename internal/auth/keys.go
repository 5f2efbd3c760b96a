// Package auth holds cgledger's NATS identities: the operator and system
// account of the embedded server, the LEDGER account that owns the streams
// and the ledger's own identity, the CLIENTS account every worker, tool
// service, auditor and admin credential lives in, the subject permissions
// each role gets, and the verification of those credentials as HTTP bearer
// tokens.
//
// Clients are in another account than the ledger's streams on purpose: a
// client then has no way to make anything land on a ledger subject, not even
// as the reply to one of its own requests (NATS answers a request on the
// requester's reply subject, and in one account that subject could be cg.>
// and be captured by the stream). Only what LEDGER exports reaches CLIENTS:
// the API as a service, commands, wakeups and cancel entries as streams, and
// the pull and ack subjects of tool consumers.
package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cgledger/cgledger/protocol"
)

// Key file names in the auth directory. Seeds are secrets: the files are
// written 0600 in a 0700 directory.
const (
	operatorSeedFile = "operator.nk"
	systemSeedFile   = "system-account.nk"
	accountSeedFile  = "ledger-account.nk"
	// signingSeedFile signs the ledger's own credentials.
	signingSeedFile        = "ledger-signing.nk"
	clientsSeedFile        = "clients-account.nk"
	clientsSigningSeedFile = "clients-signing.nk"
	// AdminCredsFile is the admin credential serve writes for the CLI.
	AdminCredsFile = "admin.creds"
)

// Account names.
const (
	AccountName        = "CGLEDGER"
	ClientsAccountName = "CGLEDGER_CLIENTS"
)

// Keys are the keys of a deployment. Signing keys sign user credentials;
// deleting one and restarting serve rotates it (every credential it signed
// stops working) while the account, and for LEDGER its JetStream data,
// stays. Operator and System are only needed by the embedded server.
type Keys struct {
	// Dir is the directory the keys were read from; project account JWTs
	// are written under it.
	Dir            string
	Operator       nkeys.KeyPair
	System         nkeys.KeyPair
	Account        nkeys.KeyPair
	Signing        nkeys.KeyPair
	Clients        nkeys.KeyPair
	ClientsSigning nkeys.KeyPair
}

// LoadOrCreateKeys reads the keys from dir, creating them on first start.
// The operator and the two accounts are created together or not at all:
// creating only some later would orphan data stored under the old ones, so
// an incomplete set is an error. Missing signing keys are created (that is
// how they are rotated).
func LoadOrCreateKeys(dir string) (*Keys, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth: key dir: %w", err)
	}
	core := []string{operatorSeedFile, systemSeedFile, accountSeedFile, clientsSeedFile}
	present := 0
	for _, f := range core {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			present++
		}
	}
	if present > 0 && present < len(core) {
		return nil, fmt.Errorf("auth: %s holds only %d of the %d key files (%s): restore them from backup", dir, present, len(core), strings.Join(core, ", "))
	}
	if present == 0 {
		if err := createKeys(dir, core...); err != nil {
			return nil, err
		}
	}
	for _, f := range []string{signingSeedFile, clientsSigningSeedFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); errors.Is(err, os.ErrNotExist) {
			if err := createKeys(dir, f); err != nil {
				return nil, err
			}
		}
	}
	k, err := LoadAccountKeys(dir)
	if err != nil {
		return nil, err
	}
	if k.Operator, err = readSeed(filepath.Join(dir, operatorSeedFile), nkeys.PrefixByteOperator); err != nil {
		return nil, err
	}
	if k.System, err = readSeed(filepath.Join(dir, systemSeedFile), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	return k, nil
}

// LoadAccountKeys reads the two accounts' keys and signing keys: what serve
// needs on an external cluster, whose operator is not ours, and what issuing
// credentials needs.
func LoadAccountKeys(dir string) (*Keys, error) {
	k := Keys{Dir: dir}
	for _, f := range []struct {
		name string
		dst  *nkeys.KeyPair
	}{{accountSeedFile, &k.Account}, {signingSeedFile, &k.Signing}, {clientsSeedFile, &k.Clients}, {clientsSigningSeedFile, &k.ClientsSigning}} {
		kp, err := readSeed(filepath.Join(dir, f.name), nkeys.PrefixByteAccount)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoKeys, err)
		}
		*f.dst = kp
	}
	return &k, nil
}

// LoadIssuer reads what issuing credentials needs: the account keys, and
// the operator key when present (to make project accounts).
func LoadIssuer(dir string) (*Issuer, error) {
	k, err := LoadAccountKeys(dir)
	if err != nil {
		return nil, err
	}
	if op, err := readSeed(filepath.Join(dir, operatorSeedFile), nkeys.PrefixByteOperator); err == nil {
		k.Operator = op
	}
	return k.Issuer()
}

func createKeys(dir string, names ...string) error {
	for _, name := range names {
		fn := nkeys.CreateAccount
		if name == operatorSeedFile {
			fn = nkeys.CreateOperator
		}
		kp, err := fn()
		if err != nil {
			return fmt.Errorf("auth: create %s: %w", name, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return fmt.Errorf("auth: seed %s: %w", name, err)
		}
		if err := WriteSecret(filepath.Join(dir, name), append(seed, '\n')); err != nil {
			return err
		}
	}
	return nil
}

// WriteSecret writes a file readable by its owner only, atomically, so a
// crash never leaves a half-written key or credential behind.
// Each writer has its own temporary file, so concurrent writers of the
// same file (two `creds issue` for one project) never rename each other's
// half-written bytes into place.
func WriteSecret(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("auth: rename %s: %w", path, err)
	}
	return nil
}

func readSeed(path string, want nkeys.PrefixByte) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: read key: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("auth: key %s: %w", path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: key %s: %w", path, err)
	}
	if nkeys.Prefix(pub) != want {
		return nil, fmt.Errorf("auth: key %s: wrong kind of key", path)
	}
	return kp, nil
}

// ServerTrust is what an embedded nats-server needs to run in operator mode:
// the operator's claims, the account JWTs to resolve, and the system account.
type ServerTrust struct {
	Operator      *jwt.OperatorClaims
	AccountJWTs   map[string]string
	SystemAccount string
	// Keys find project account JWTs (under their Dir) and check that they
	// belong to the current keys (a rotated signing key leaves stale ones).
	Keys *Keys
}

// ledgerExports are what the ledger's account offers the clients'
// accounts. Everything else of it is out of their reach.
func ledgerExports() []*jwt.Export {
	stream := DefaultStream
	svc := func(name, subj string, rt jwt.ResponseType) *jwt.Export {
		return &jwt.Export{Name: name, Subject: jwt.Subject(subj), Type: jwt.Service, ResponseType: rt}
	}
	str := func(name, subj string) *jwt.Export {
		return &jwt.Export{Name: name, Subject: jwt.Subject(subj), Type: jwt.Stream}
	}
	return []*jwt.Export{
		svc("ledger api", APIPrefix+".>", jwt.ResponseTypeSingleton),
		svc("tool consumer pull", "$JS.API.CONSUMER.MSG.NEXT."+stream+".*", jwt.ResponseTypeStream),
		svc("tool consumer info", "$JS.API.CONSUMER.INFO."+stream+".*", jwt.ResponseTypeSingleton),
		svc("tool consumer ack", "$JS.ACK."+stream+".>", jwt.ResponseTypeSingleton),
		str("commands and wakeups", protocol.CommandSubjectPattern("*", "*")),
		str("cancel entries", protocol.CancelSubjectPattern("*", "*")),
	}
}

// Trust builds the operator and account claims from the keys. They are
// re-signed on every start; only the keys persist.
func (k *Keys) Trust() (*ServerTrust, error) {
	pub := func(kp nkeys.KeyPair, what string) (string, error) {
		p, err := kp.PublicKey()
		if err != nil {
			return "", fmt.Errorf("auth: %s key: %w", what, err)
		}
		return p, nil
	}
	opPub, err := pub(k.Operator, "operator")
	if err != nil {
		return nil, err
	}
	sysPub, err := pub(k.System, "system")
	if err != nil {
		return nil, err
	}
	accPub, err := pub(k.Account, "ledger account")
	if err != nil {
		return nil, err
	}
	sigPub, err := pub(k.Signing, "ledger signing")
	if err != nil {
		return nil, err
	}
	cliPub, err := pub(k.Clients, "clients account")
	if err != nil {
		return nil, err
	}
	cliSigPub, err := pub(k.ClientsSigning, "clients signing")
	if err != nil {
		return nil, err
	}
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "cgledger"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(k.Operator)
	if err != nil {
		return nil, fmt.Errorf("auth: sign operator: %w", err)
	}
	// Decoding gives the claims the server compares account issuers against.
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		return nil, fmt.Errorf("auth: operator claims: %w", err)
	}
	jwts := map[string]string{}
	sign := func(c *jwt.AccountClaims) error {
		tok, err := c.Encode(k.Operator)
		if err != nil {
			return fmt.Errorf("auth: sign account %s: %w", c.Name, err)
		}
		jwts[c.Subject] = tok
		return nil
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	if err := sign(sc); err != nil {
		return nil, err
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = AccountName
	ac.SigningKeys.Add(sigPub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	exports := ledgerExports()
	ac.Exports.Add(exports...)
	if err := sign(ac); err != nil {
		return nil, err
	}
	cc := jwt.NewAccountClaims(cliPub)
	cc.Name = ClientsAccountName
	cc.SigningKeys.Add(cliSigPub)
	for _, im := range clientImports(accPub, "") {
		cc.Imports.Add(im)
	}
	if err := sign(cc); err != nil {
		return nil, err
	}
	return &ServerTrust{Operator: opClaims, AccountJWTs: jwts, SystemAccount: sysPub, Keys: k}, nil
}

// ErrNoKeys is returned when a directory has no account keys to issue with.
var ErrNoKeys = errors.New("auth: no account keys")

// DeriveKey returns a secret for purpose, derived from the ledger account's
// seed: stable across restarts and processes of one deployment, unknown to
// anyone without the keys.
func (k *Keys) DeriveKey(purpose string) ([]byte, error) {
	return derive(k.Account, purpose)
}

// derive is HMAC-SHA256 keyed by kp's seed over a purpose: secrets that
// follow a key (rotating the key replaces them) without being stored.
func derive(kp nkeys.KeyPair, purpose string) ([]byte, error) {
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("auth: seed: %w", err)
	}
	m := hmac.New(sha256.New, seed)
	m.Write([]byte("cgledger/" + purpose))
	return m.Sum(nil), nil
}
