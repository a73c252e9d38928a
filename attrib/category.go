package attrib

// Category is what an allocation holds.
type Category string

const (
	Parameters     Category = "parameters"
	OptimizerState Category = "optimizer state"
	Gradients      Category = "gradients"
	Activations    Category = "activations"
	Temporaries    Category = "temporaries"
	Communication  Category = "communication"
	// Persistent is what lives across training steps and no frame names:
	// parameters or optimizer state.
	Persistent Category = "persistent state"
	Unknown    Category = "unknown"
)

// Verdict is a block's category, how sure it is, and the rule that gave it.
type Verdict struct {
	Category Category `json:"category"`
	Sure     Sureness `json:"sure"`
	Rule     string   `json:"rule"`
}

// Sureness says how much a verdict rests on.
type Sureness string

const (
	High   Sureness = "high"   // the user said so, or two independent signs agree
	Medium Sureness = "medium" // one sign: a frame rule, or an annotated region
	Low    Sureness = "low"    // allocator facts alone
)
