// Package migrations holds vramscope's database schema as numbered SQL files
// (NNNN_name.sql), applied in order by the store: SQLite's at the root,
// PostgreSQL's in postgres/. Files are only ever added: a released file
// never changes, so every database can be brought forward.
package migrations

import (
	"embed"
	"io/fs"
)

// FS holds the SQLite migration files at its root.
//
//go:embed *.sql
var FS embed.FS

//go:embed postgres/*.sql
var postgres embed.FS

// Postgres holds the PostgreSQL migration files at its root.
var Postgres, _ = fs.Sub(postgres, "postgres")
