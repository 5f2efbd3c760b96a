package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
)

// Verification errors. Callers branch on them to answer 401.
var (
	ErrNoCredential  = errors.New("auth: no credential")
	ErrBadCredential = errors.New("auth: invalid credential")
	ErrExpired       = errors.New("auth: credential expired")
)

// Verifier checks user JWTs (HTTP bearer tokens) against the ledger
// account: signed by one of its signing keys, not expired, carrying a grant.
type Verifier struct {
	account string
	signers map[string]bool
}

// NewVerifier trusts JWTs of account signed by any of signers.
func NewVerifier(account string, signers ...string) *Verifier {
	v := &Verifier{account: account, signers: map[string]bool{}}
	for _, s := range signers {
		v.signers[s] = true
	}
	return v
}

// Verifier returns a verifier trusting the keys' account and signing key.
func (k *Keys) Verifier() (*Verifier, error) {
	acc, err := k.Account.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: account key: %w", err)
	}
	sig, err := k.Signing.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: signing key: %w", err)
	}
	return NewVerifier(acc, sig), nil
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
	if !v.signers[uc.Issuer] || uc.IssuerAccount != v.account {
		return Grant{}, fmt.Errorf("%w: not issued by this ledger", ErrBadCredential)
	}
	if uc.Expires > 0 && now.Unix() >= uc.Expires {
		return Grant{}, fmt.Errorf("%w at %s", ErrExpired, time.Unix(uc.Expires, 0).UTC().Format(time.RFC3339))
	}
	var g Grant
	if err := json.Unmarshal([]byte(uc.Name), &g); err != nil || len(g.Validate()) > 0 {
		return Grant{}, fmt.Errorf("%w: no cgledger grant", ErrBadCredential)
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
