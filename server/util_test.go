package server

import (
	"io"
	"log/slog"
	"strconv"
)

func strconvI(n int64) string { return strconv.FormatInt(n, 10) }

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
