// Package auth holds cgledger's NATS identities: the operator, system and
// ledger account keys of the embedded server, the credentials issued to
// workers, tool services, auditors and admins, the subject permissions each
// role gets, and the verification of those credentials as HTTP bearer tokens.
// NATS enforces the permissions; the ledger checks them again (defence in
// depth) from the subject a request arrived on.
package auth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Key file names in the auth directory. Seeds are secrets: the files are
// written 0600 in a 0700 directory.
const (
	operatorSeedFile = "operator.nk"
	systemSeedFile   = "system-account.nk"
	accountSeedFile  = "ledger-account.nk"
	// signingSeedFile signs user credentials. Deleting it and restarting
	// serve rotates it: every credential signed by the old key stops working,
	// while the account (and its JetStream data) stays the same.
	signingSeedFile = "ledger-signing.nk"
	// AdminCredsFile is the admin credential serve writes for the CLI.
	AdminCredsFile = "admin.creds"
)

// AccountName is the name of the account that holds the ledger's streams and
// every client identity.
const AccountName = "CGLEDGER"

// Keys are the keys of an embedded deployment: an operator, the system
// account the server needs in operator mode, the ledger account, and the
// account's signing key, which signs every user credential.
type Keys struct {
	Operator nkeys.KeyPair
	System   nkeys.KeyPair
	Account  nkeys.KeyPair
	Signing  nkeys.KeyPair
}

// LoadOrCreateKeys reads the keys from dir, creating any that are missing on
// first start. Creating only some of them on a later start would orphan the
// account's data (JetStream stores it under the account key), so an
// incomplete directory is an error, not something to repair.
func LoadOrCreateKeys(dir string) (*Keys, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth: key dir: %w", err)
	}
	files := []string{operatorSeedFile, systemSeedFile, accountSeedFile}
	present := 0
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			present++
		}
	}
	if present > 0 && present < len(files) {
		return nil, fmt.Errorf("auth: %s holds only %d of the %d key files (%s): restore them from backup", dir, present, len(files), strings.Join(files, ", "))
	}
	if present == 0 {
		if err := createKeys(dir, operatorSeedFile, systemSeedFile, accountSeedFile); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(dir, signingSeedFile)); errors.Is(err, os.ErrNotExist) {
		if err := createKeys(dir, signingSeedFile); err != nil {
			return nil, err
		}
	}
	return LoadKeys(dir)
}

// LoadKeys reads existing keys from dir.
func LoadKeys(dir string) (*Keys, error) {
	var k Keys
	var err error
	if k.Operator, err = readSeed(filepath.Join(dir, operatorSeedFile), nkeys.PrefixByteOperator); err != nil {
		return nil, err
	}
	if k.System, err = readSeed(filepath.Join(dir, systemSeedFile), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if k.Account, err = readSeed(filepath.Join(dir, accountSeedFile), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if k.Signing, err = readSeed(filepath.Join(dir, signingSeedFile), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	return &k, nil
}

// LoadAccountKeys reads only the ledger account's keys: what serve needs on
// an external cluster, whose operator is not ours.
func LoadAccountKeys(dir string) (*Keys, error) {
	var k Keys
	var err error
	if k.Account, err = readSeed(filepath.Join(dir, accountSeedFile), nkeys.PrefixByteAccount); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoKeys, err)
	}
	if k.Signing, err = readSeed(filepath.Join(dir, signingSeedFile), nkeys.PrefixByteAccount); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoKeys, err)
	}
	return &k, nil
}

// LoadIssuer reads what issuing credentials needs: the ledger account's
// public key and its signing key.
func LoadIssuer(dir string) (*Issuer, error) {
	acc, err := readSeed(filepath.Join(dir, accountSeedFile), nkeys.PrefixByteAccount)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoKeys, err)
	}
	sk, err := readSeed(filepath.Join(dir, signingSeedFile), nkeys.PrefixByteAccount)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoKeys, err)
	}
	return NewIssuer(acc, sk)
}

func createKeys(dir string, names ...string) error {
	for _, name := range names {
		fn := nkeys.CreateAccount
		if name == operatorSeedFile {
			fn = nkeys.CreateOperator
		}
		m := struct{ file string }{name}
		kp, err := fn()
		if err != nil {
			return fmt.Errorf("auth: create %s: %w", m.file, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return fmt.Errorf("auth: seed %s: %w", m.file, err)
		}
		if err := writeSecret(filepath.Join(dir, m.file), append(seed, '\n')); err != nil {
			return err
		}
	}
	return nil
}

// writeSecret writes a file readable by its owner only, atomically, so a
// crash never leaves a half-written key behind.
func writeSecret(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	f, err := os.Open(tmp)
	if err == nil {
		err = f.Sync()
		_ = f.Close()
	}
	if err != nil {
		return fmt.Errorf("auth: sync %s: %w", path, err)
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
}

// Trust builds the operator and account claims from the keys. They are
// re-signed on every start; only the keys persist.
func (k *Keys) Trust() (*ServerTrust, error) {
	opPub, err := k.Operator.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: operator key: %w", err)
	}
	sysPub, err := k.System.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: system key: %w", err)
	}
	accPub, err := k.Account.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: account key: %w", err)
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
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(k.Operator)
	if err != nil {
		return nil, fmt.Errorf("auth: sign system account: %w", err)
	}
	sigPub, err := k.Signing.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: signing key: %w", err)
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = AccountName
	ac.SigningKeys.Add(sigPub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	accJWT, err := ac.Encode(k.Operator)
	if err != nil {
		return nil, fmt.Errorf("auth: sign ledger account: %w", err)
	}
	return &ServerTrust{Operator: opClaims, AccountJWTs: map[string]string{sysPub: sysJWT, accPub: accJWT}, SystemAccount: sysPub}, nil
}

// ErrNoKeys is returned when a directory has no account keys to issue with.
var ErrNoKeys = errors.New("auth: no ledger account key")
