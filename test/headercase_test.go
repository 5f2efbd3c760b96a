package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/replay"
	"github.com/cgledger/cgledger/stream"
)

// TestHeaderNameCaseChangesNeitherChainNorViews: the hash chain reads header
// names case-insensitively, as the protocol does; the views must too, or an
// export whose header names were re-cased would verify with the same chain
// head while meaning something else. Both spellings must give the same
// chain head and the same view digest.
func TestHeaderNameCaseChangesNeitherChainNorViews(t *testing.T) {
	t.Parallel()
	src := filepath.Join("testdata", "happy_path.jsonl")
	f, err := os.Open(src)
	require.NoError(t, err)
	defer f.Close()
	var out bytes.Buffer
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	changed := 0
	for sc.Scan() {
		var line map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		if raw, ok := line["headers"]; ok {
			var h map[string][]string
			require.NoError(t, json.Unmarshal(raw, &h))
			re := map[string][]string{}
			for k, v := range h {
				if strings.HasPrefix(k, "CG-") {
					k = strings.ToLower(k)
					changed++
				}
				re[k] = v
			}
			line["headers"], err = json.Marshal(re)
			require.NoError(t, err)
		}
		b, err := json.Marshal(line)
		require.NoError(t, err)
		out.Write(append(b, '\n'))
	}
	require.NoError(t, sc.Err())
	require.Positive(t, changed)
	recased := filepath.Join(t.TempDir(), "recased.jsonl")
	require.NoError(t, os.WriteFile(recased, out.Bytes(), 0o600))

	ctx := ledgertest.Ctx(t)
	orig, err := replay.Run(ctx, src, replay.Options{})
	require.NoError(t, err)
	again, err := replay.Run(ctx, recased, replay.Options{})
	require.NoError(t, err)
	require.True(t, again.File.OK, "the re-cased file verifies: %+v", again.File)
	require.Equal(t, orig.ChainHead, again.ChainHead)
	require.Equal(t, orig.Digest, again.Digest, "same chain, same views")
	rep, err := stream.VerifyExport(bytes.NewReader(out.Bytes()))
	require.NoError(t, err)
	require.True(t, rep.OK)
	require.Zero(t, rep.UnrecognizedCount, "re-cased entries are still recognized")
}
