"""`tracemill demo`: the whole loop on one machine (`cli`), its steps (`run`), the weak model server (`weak_model`),
the agent (`agent`), the phases' figures (`phases`) and the processes it starts (`processes`)."""
