// Package migrations holds vramscope's database schema as numbered SQL files
// (NNNN_name.sql), applied in order by the store. Files are only ever added:
// a released file never changes, so every database can be brought forward.
package migrations

import "embed"

// FS holds the migration files at its root.
//
//go:embed *.sql
var FS embed.FS
