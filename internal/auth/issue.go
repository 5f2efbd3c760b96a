package auth

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Issuer signs user credentials: the ledger's own in the ledger's account,
// a project's in that project's account (its JWT written for the server to
// find), every-project ("*") ones in the clients' account. Without the
// operator key (an external cluster), project credentials go to the
// clients' account too.
type Issuer struct {
	keys            *Keys
	ledger, clients signer
}

type signer struct {
	account string
	key     nkeys.KeyPair
}

func newSigner(account, key nkeys.KeyPair) (signer, error) {
	pub, err := account.PublicKey()
	if err != nil {
		return signer{}, fmt.Errorf("auth: account key: %w", err)
	}
	return signer{account: pub, key: key}, nil
}

// Issuer returns an issuer for the keys.
func (k *Keys) Issuer() (*Issuer, error) {
	l, err := newSigner(k.Account, k.Signing)
	if err != nil {
		return nil, err
	}
	c, err := newSigner(k.Clients, k.ClientsSigning)
	if err != nil {
		return nil, err
	}
	return &Issuer{keys: k, ledger: l, clients: c}, nil
}

// signerFor picks the account a grant's credential lives in, making the
// project's account known to the server first.
func (is *Issuer) signerFor(g Grant) (signer, error) {
	switch {
	case g.Role == RoleLedger:
		return is.ledger, nil
	case g.Project == AllProjects || is.keys.Operator == nil || is.keys.Dir == "":
		return is.clients, nil
	}
	acc, err := is.keys.ProjectAccount(g.Project)
	if err != nil {
		return signer{}, err
	}
	pub, err := acc.PublicKey()
	if err != nil {
		return signer{}, fmt.Errorf("auth: project account key: %w", err)
	}
	tok, err := is.keys.projectAccountJWT(g.Project, acc)
	if err != nil {
		return signer{}, err
	}
	dir := filepath.Join(is.keys.Dir, accountsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return signer{}, fmt.Errorf("auth: accounts dir: %w", err)
	}
	if err := WriteSecret(filepath.Join(dir, pub+".jwt"), []byte(tok+"\n")); err != nil {
		return signer{}, err
	}
	// Signed by the account key itself: the JWT names no issuer account.
	return signer{key: acc}, nil
}

// Credential is an issued user credential.
type Credential struct {
	// Creds is a standard NATS .creds file (user JWT and seed).
	Creds []byte
	// JWT is the user JWT alone: the HTTP bearer token.
	JWT string
	// Seed is the user's nkey seed (secret).
	Seed string
	// PublicKey is the user's public key.
	PublicKey string
	// InboxPrefix is the inbox prefix the client must use for replies.
	InboxPrefix string
	// Expires is when the credential stops working; zero means never.
	Expires time.Time
	// Grant is what it may do.
	Grant Grant
}

// Issue creates a new user key and a credential for g, valid for ttl (zero
// means no expiry: only for the ledger's own and the embedded admin's
// credentials, which are re-issued on every start).
func (is *Issuer) Issue(g Grant, ttl time.Duration, now time.Time) (*Credential, error) {
	if errs := g.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("auth: invalid grant: %v", errs)
	}
	if ttl < 0 {
		return nil, fmt.Errorf("auth: negative ttl %s", ttl)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("auth: create user key: %w", err)
	}
	pub, err := user.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("auth: user key: %w", err)
	}
	seed, err := user.Seed()
	if err != nil {
		return nil, fmt.Errorf("auth: user seed: %w", err)
	}
	uc := jwt.NewUserClaims(pub)
	name, err := json.Marshal(g)
	if err != nil {
		return nil, fmt.Errorf("auth: encode grant: %w", err)
	}
	uc.Name = string(name)
	sg, err := is.signerFor(g)
	if err != nil {
		return nil, err
	}
	uc.IssuerAccount = sg.account
	uc.IssuedAt = now.Unix()
	var expires time.Time
	if ttl > 0 {
		expires = now.Add(ttl).Truncate(time.Second)
		uc.Expires = expires.Unix()
	}
	p, s := g.Permissions(pub)
	uc.Pub.Allow.Add(p...)
	uc.Sub.Allow.Add(s...)
	tok, err := uc.Encode(sg.key)
	if err != nil {
		return nil, fmt.Errorf("auth: sign user: %w", err)
	}
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		return nil, fmt.Errorf("auth: format creds: %w", err)
	}
	return &Credential{Creds: creds, JWT: tok, Seed: string(seed), PublicKey: pub, InboxPrefix: InboxPrefix(pub), Expires: expires, Grant: g}, nil
}
