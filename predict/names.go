package predict

import (
	"regexp"
	"strconv"
	"strings"
)

// batchWord finds a batch size in a name: "batch 8", "batch=8",
// "batch_size 8", "bs8", "bs=8".
var batchWord = regexp.MustCompile(`(?i)(?:^|[^a-z0-9])((?:batch(?:[ _-]?size)?|bs)[ _=:-]?(\d{1,7}))(?:$|[^a-z0-9])`)

// BatchInName reads the batch size a trace's name states ("gpt batch 8",
// "llama bs=16") and the job it names without it ("gpt", "llama"):
// traces whose jobs read the same are recordings of one job at several
// batch sizes. ok is false when the name states none.
func BatchInName(name string) (batch int, job string, ok bool) {
	m := batchWord.FindStringSubmatchIndex(name)
	if m == nil {
		return 0, "", false
	}
	n, err := strconv.Atoi(name[m[4]:m[5]])
	if err != nil || n <= 0 {
		return 0, "", false
	}
	job = strings.Join(strings.Fields(name[:m[2]]+" "+name[m[3]:]), " ")
	return n, strings.Trim(job, " ,;:-_"), true
}
