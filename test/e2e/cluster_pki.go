package e2e

// The cluster's certificates and kubeconfigs, made here with crypto/x509
// (no bootstrap tool): one CA signs the API server's serving certificate
// and every client's; the service-account token key pair is separate.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// clusterCA is the cluster's certificate authority.
type clusterCA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	dir     string // where every file is written
}

// newClusterCA makes a CA valid for a day and writes ca.crt to dir.
func newClusterCA(dir string) (*clusterCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pleg-e2e-cluster-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &clusterCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), dir: dir}
	return ca, os.WriteFile(ca.path("ca.crt"), ca.certPEM, 0o644)
}

func (ca *clusterCA) path(name string) string { return filepath.Join(ca.dir, name) }

// issued is a certificate the CA signed and its key, PEM-encoded.
type issued struct{ cert, key []byte }

// issue signs a certificate for cn in the organizations orgs: a client
// certificate, and a serving one too when hosts (IPs or DNS names) are
// given. It writes <name>.crt and <name>.key.
func (ca *clusterCA) issue(name, cn string, orgs []string, hosts ...string) (issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return issued{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return issued{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return issued{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return issued{}, err
	}
	out := issued{
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	if err := os.WriteFile(ca.path(name+".crt"), out.cert, 0o644); err != nil {
		return issued{}, err
	}
	return out, os.WriteFile(ca.path(name+".key"), out.key, 0o600)
}

// kubeconfig writes <name>.kubeconfig: server, the CA and the client
// certificate c, all embedded.
func (ca *clusterCA) kubeconfig(name, server string, c issued) (string, error) {
	b64 := base64.StdEncoding.EncodeToString
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: pleg-e2e
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: pleg-e2e
  context:
    cluster: pleg-e2e
    user: %s
current-context: pleg-e2e
`, server, b64(ca.certPEM), name, b64(c.cert), b64(c.key), name)
	p := ca.path(name + ".kubeconfig")
	return p, os.WriteFile(p, []byte(cfg), 0o600)
}

// serviceAccountKeys writes sa.key and sa.pub, the key pair the API
// server signs and checks service-account tokens with.
func (ca *clusterCA) serviceAccountKeys() (private, public string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	private, public = ca.path("sa.key"), ca.path("sa.pub")
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	return private, public, os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}
