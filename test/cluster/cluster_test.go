package cluster

import (
	"os"
	"testing"

	"github.com/podlifecycle/pleg/test/e2e"
)

func TestMain(m *testing.M) {
	os.Exit(e2e.Main(m, e2e.ClusterRuntimes...))
}

// TestClusterInstall: see e2e.ClusterInstall.
func TestClusterInstall(t *testing.T) { e2e.ClusterInstall(t) }

// TestClusterUpgrade: see e2e.ClusterUpgrade.
func TestClusterUpgrade(t *testing.T) { e2e.ClusterUpgrade(t) }
