package archive_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/archive"
	"github.com/cgledger/cgledger/internal/violationtest"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, archive.Config{}.Validate(), "zero values are the defaults")
	err := archive.Config{Retention: -1, SealAge: -1, SegmentBytes: -1}.Validate()
	require.Equal(t, []string{"Retention", "SealAge", "SegmentBytes"}, violationtest.ConfigFields(t, err))
	_, err = archive.New(nil, nil, archive.Config{SegmentBytes: -1})
	require.Equal(t, []string{"SegmentBytes"}, violationtest.ConfigFields(t, err))
}
