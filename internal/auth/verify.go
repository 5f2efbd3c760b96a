package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Verification errors. Callers branch on them to answer 401.
var (
	ErrNoCredential  = errors.New("auth: no credential")
	ErrBadCredential = errors.New("auth: invalid credential")
	ErrExpired       = errors.New("auth: credential expired")
)

// Verifier checks user JWTs (HTTP bearer tokens): signed by the signing key
// of the account their role lives in, not expired, carrying a grant.
type Verifier struct {
	keys            *Keys
	ledger, clients signerPub
}

type signerPub struct{ account, key string }

// Verifier returns a verifier trusting the keys' accounts and signing keys.
func (k *Keys) Verifier() (*Verifier, error) {
	v := Verifier{keys: k}
	for _, p := range []struct {
		dst  *string
		kp   nkeys.KeyPair
		what string
	}{{&v.ledger.account, k.Account, "ledger account"}, {&v.ledger.key, k.Signing, "ledger signing"},
		{&v.clients.account, k.Clients, "clients account"}, {&v.clients.key, k.ClientsSigning, "clients signing"}} {
		pub, err := p.kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("auth: %s key: %w", p.what, err)
		}
		*p.dst = pub
	}
	return &v, nil
}

// Verify decodes and checks a user JWT and returns its grant.
func (v *Verifier) Verify(token string, now time.Time) (Grant, error) {
	token = strings.TrimSpace(token)
	if token == "" {
		return Grant{}, ErrNoCredential
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return Grant{}, fmt.Errorf("%w: %v", ErrBadCredential, err)
	}
	// The grant says which account the credential must have been signed in;
	// it is only trusted once that signature is checked below.
	var g Grant
	if err := json.Unmarshal([]byte(uc.Name), &g); err != nil || len(g.Validate()) > 0 {
		return Grant{}, fmt.Errorf("%w: no cgledger grant", ErrBadCredential)
	}
	fromClients := uc.Issuer == v.clients.key && uc.IssuerAccount == v.clients.account
	fromLedger := uc.Issuer == v.ledger.key && uc.IssuerAccount == v.ledger.account
	fromProject := false
	if g.Role != RoleLedger && g.Project != AllProjects && uc.IssuerAccount == "" {
		if acc, err := v.keys.ProjectAccount(g.Project); err == nil {
			pub, _ := acc.PublicKey()
			fromProject = uc.Issuer == pub
		}
	}
	switch {
	case !fromClients && !fromLedger && !fromProject:
		return Grant{}, fmt.Errorf("%w: not issued by this ledger", ErrBadCredential)
	case (g.Role == RoleLedger) != fromLedger:
		// A grant is only worth what the account it was signed in allows.
		return Grant{}, fmt.Errorf("%w: role %s signed in the wrong account", ErrBadCredential, g.Role)
	}
	if uc.Expires > 0 && now.Unix() >= uc.Expires {
		return Grant{}, fmt.Errorf("%w at %s", ErrExpired, time.Unix(uc.Expires, 0).UTC().Format(time.RFC3339))
	}
	if uc.NotBefore > 0 && now.Unix() < uc.NotBefore {
		return Grant{}, fmt.Errorf("%w: not valid before %s", ErrBadCredential, time.Unix(uc.NotBefore, 0).UTC().Format(time.RFC3339))
	}
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if vr.IsBlocking(false) {
		return Grant{}, fmt.Errorf("%w: %v", ErrBadCredential, vr.Errors())
	}
	return g, nil
}

// ReadCreds reads a .creds file and returns its user JWT and the inbox
// prefix its permissions allow.
func ReadCreds(path string) (token, inboxPrefix string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("auth: read creds: %w", err)
	}
	token, err = jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", "", fmt.Errorf("auth: creds %s: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", "", fmt.Errorf("auth: creds %s: %w", path, err)
	}
	return token, InboxPrefix(uc.Subject), nil
}
